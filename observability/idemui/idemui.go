package idemui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Option configures a [Handler].
type Option func(*config)

type config struct {
	writes       bool
	auth         func(*http.Request) (operator string, ok bool)
	token        string
	audit        AuditSink
	logger       *slog.Logger
	lease        time.Duration
	storeTimeout time.Duration
	retention    time.Duration
	pageSize     int
	showBodies   bool
}

// WithWrites enables the console's actions (resolve a step, complete,
// release, evict); without it the console is read-only. auth names the
// operator of a request (ok = false: not authenticated, the action is
// refused with 401), typically from the service's own session or SSO
// middleware; nil takes the operator of the [WithToken] session, and
// [Handler] panics when there is none. The operator's name goes to the
// audit log.
func WithWrites(auth func(r *http.Request) (operator string, ok bool)) Option {
	return func(c *config) { c.writes, c.auth = true, auth }
}

// WithToken makes every page, read or write, need a session opened at
// the console's login page with token (a secret of at least 16
// characters, else [Handler] panics) and an operator's name: the
// standalone server's mode (idemctl serve -token). The session is an
// HttpOnly, SameSite=Strict cookie holding the name and its HMAC under a
// key derived from token, never the token.
func WithToken(token string) Option { return func(c *config) { c.token = token } }

// WithAudit sends each action's [AuditEntry] to sink as well as to the
// logger ([WithLogger]); when sink is also an [AuditReader], the console
// shows its entries. Default: an [AuditLog] of the last 1000 entries, in
// memory.
func WithAudit(sink AuditSink) Option { return func(c *config) { c.audit = sink } }

// WithLogger sets where each action's audit event is logged (message
// "idemui: operator action", level Info; Warn when it failed). Default:
// [slog.Default].
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithLease gives the service's lease ([idem.WithLease]) and store
// timeout ([idem.WithStoreTimeout]), to tell a holder that renews its
// lease from one that stopped and the time since the last renewal.
// Default: [idem.DefaultLease], [idem.DefaultStoreTimeout].
func WithLease(lease, storeTimeout time.Duration) Option {
	return func(c *config) { c.lease, c.storeTimeout = lease, storeTimeout }
}

// WithRetention gives the service's retention ([idem.WithRetention]): how
// long a completed record's answer is kept, the default of the complete
// action and what tells how long ago a record completed. Default:
// [idem.DefaultRetention].
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithPageSize sets how many records a listing page asks the store for
// ([idem.ListQuery] Limit). Default 50.
func WithPageSize(n int) Option { return func(c *config) { c.pageSize = n } }

// ShowBodies shows the bodies of stored answers; by default only their
// size is shown, since they may hold personal data. Credential headers
// (Authorization, Cookie, Set-Cookie, Proxy-Authorization) are redacted
// always.
func ShowBodies() Option { return func(c *config) { c.showBodies = true } }

// console is the Handler's state.
type console struct {
	cfg    config
	store  idem.Store
	in     idem.Inspector
	ls     idem.Lister       // nil: no listing
	jr     idem.Journal      // nil: no steps
	kp     idem.Keeper       // nil: no release, complete
	rs     idem.StepResolver // nil: no resolve-step
	rc     idem.Recoverable  // nil: no due listing
	reader AuditReader       // nil: no audit shown
	secret []byte            // form tokens' and sessions' HMAC key
	tmpl   map[string]*template.Template
}

// Handler returns the operator's console for store: server-rendered pages
// of its records by state, one record with its steps and stored answer,
// and, with [WithWrites], the actions an operator settles a record with,
// each after a confirmation page and recorded in the audit log. Mount it
// under a prefix with [http.StripPrefix]:
//
//	mux.Handle("/idem/", http.StripPrefix("/idem", idemui.Handler(store, idemui.WithWrites(auth))))
//
// Its links follow the prefix it is mounted under. Reads need no operator
// unless [WithToken] is given: mount it behind the service's admin
// authentication, as its metrics or pprof. store must implement
// [idem.Inspector] (Handler panics otherwise); the listing needs
// [idem.Lister], the steps [idem.Journal], release and complete
// [idem.Keeper], resolve-step [idem.StepResolver], the due listing
// [idem.Recoverable]: what store lacks is not offered. Writes are
// protected against cross-origin requests ([http.CrossOriginProtection])
// and by a per-form token. The console loads nothing from outside the
// binary and runs no script.
func Handler(store idem.Store, opts ...Option) http.Handler {
	c := &console{store: store, cfg: config{
		logger: slog.Default(), lease: idem.DefaultLease, storeTimeout: idem.DefaultStoreTimeout,
		retention: idem.DefaultRetention, pageSize: 50,
	}}
	for _, o := range opts {
		o(&c.cfg)
	}
	in, ok := store.(idem.Inspector)
	if !ok {
		panic("idemui: the store does not implement idem.Inspector")
	}
	c.in = in
	c.ls, _ = store.(idem.Lister)
	c.jr, _ = store.(idem.Journal)
	c.kp, _ = store.(idem.Keeper)
	c.rs, _ = store.(idem.StepResolver)
	c.rc, _ = store.(idem.Recoverable)
	switch {
	case c.cfg.token != "" && len(c.cfg.token) < 16:
		panic("idemui: WithToken needs a token of at least 16 characters")
	case c.cfg.writes && c.cfg.auth == nil && c.cfg.token == "":
		panic("idemui: WithWrites needs an authenticator, or WithToken")
	case c.cfg.pageSize <= 0 || c.cfg.lease <= 0 || c.cfg.storeTimeout <= 0 || c.cfg.retention <= 0:
		panic("idemui: page size, lease, store timeout and retention must be > 0")
	}
	if c.cfg.token != "" {
		mac := hmac.New(sha256.New, []byte("idemui session"))
		mac.Write([]byte(c.cfg.token))
		c.secret = mac.Sum(nil)
	} else {
		c.secret = make([]byte, 32)
		_, _ = rand.Read(c.secret)
	}
	if c.cfg.audit == nil {
		c.cfg.audit = NewAuditLog(1000)
	}
	c.reader, _ = c.cfg.audit.(AuditReader)
	c.tmpl = parseTemplates()

	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", c.list)
	mux.HandleFunc("GET /record/{key}", c.record)
	mux.HandleFunc("GET /record/{key}/confirm", c.confirm)
	mux.HandleFunc("POST /record/{key}/act", c.act)
	mux.HandleFunc("GET /audit", c.auditPage)
	mux.HandleFunc("GET /login", c.loginPage)
	mux.HandleFunc("POST /login", c.login)
	mux.HandleFunc("POST /logout", c.logout)
	var h http.Handler = mux
	h = c.guard(h)
	return http.NewCrossOriginProtection().Handler(securityHeaders(h))
}

// securityHeaders sets the headers every page carries: no script, no
// framing, nothing loaded from elsewhere, no caching of records.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// base returns the path the console is mounted under ("" at the root),
// from the request's URI and the path left after [http.StripPrefix]: a
// path of one leading slash, no trailing one and no dot segment, never a
// host ("//host"), so that links and redirects stay on this server.
func base(r *http.Request) string {
	uri := r.RequestURI
	if i := strings.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	p := r.URL.EscapedPath()
	if !strings.HasSuffix(uri, p) {
		return ""
	}
	b := strings.TrimRight(strings.TrimSuffix(uri, p), "/") // a prefix "/" is the root: base+"/x" must not be "//x"
	if b != "" && (b[0] != '/' || strings.HasPrefix(b, "//") || strings.ContainsAny(b, "\\:") || strings.Contains(b, "/.")) {
		return ""
	}
	return b
}

// redirect answers 303 See Other to path under the console's base.
func redirect(w http.ResponseWriter, r *http.Request, path string) {
	http.Redirect(w, r, base(r)+path, http.StatusSeeOther) //nolint:gosec // base is a local path (base's rules), path the console's own
}

// formToken returns the per-form token of operator's actions on key.
func (c *console) formToken(operator, key string) string {
	mac := hmac.New(sha256.New, c.secret)
	mac.Write([]byte("form\x00" + operator + "\x00" + key))
	return hex.EncodeToString(mac.Sum(nil))
}
