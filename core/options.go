package idem

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Defaults of the [Engine]'s options.
const (
	DefaultHeader           = "Idempotency-Key"
	DefaultLease            = 30 * time.Second
	DefaultRetention        = 24 * time.Hour
	DefaultStoreTimeout     = 2 * time.Second
	DefaultMaxBodyBytes     = 1 << 20
	DefaultMaxResponseBytes = 1 << 20
	DefaultRetryAfter       = 1 * time.Second
	DefaultCompletionRetry  = 1 * time.Minute
)

// ReplayedHeader marks a replayed response, with the value "true" (Stripe's
// Idempotent-Replayed; the IETF draft has no marker yet, httpapi wg issue #46).
const ReplayedHeader = "Idempotent-Replayed"

// Option configures an [Engine].
type Option func(*config)

type config struct {
	header           string
	methods          map[string]bool
	badMethods       []string // WithMethods names that are not tokens
	lease            time.Duration
	retention        time.Duration
	storeTimeout     time.Duration
	maxBodyBytes     int64
	maxResponseBytes int
	wait             time.Duration
	completionRetry  time.Duration
	retryAfter       time.Duration
	storePolicy      func(status int) bool
	keyOptional      bool
	keyValidator     func(key string) error
	renderProblem    func(Problem) (contentType string, body []byte)
	failOpen         bool
	globalScope      bool
	unstored         map[string]bool
	stored           map[string]bool // allowlist; nil means every name not unstored
	logger           *slog.Logger
	onEvent          func(context.Context, Event)

	replayCheck       func(context.Context, ReplayInfo) error // WithReplayCheck; nil: none
	fingerprint       Fingerprinter                           // WithFingerprint; zero: bytes
	routes            map[routeKey]*routePolicy               // WithRoute
	policy            routePolicy                             // every other route's, built by validate
	knownFingerprints []Fingerprinter                         // WithKnownFingerprints
	fingerprints      map[string]Fingerprinter                // every one above by ID, built by validate
	keep              Keep                                    // WithUncertainAfterCrash, WithTombstones
	recover           bool                                    // WithRecovery
	recoverHeaders    []string                                // WithRecovery's header names, canonical
}

func defaultConfig() config {
	return config{
		header:           DefaultHeader,
		methods:          map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		lease:            DefaultLease,
		retention:        DefaultRetention,
		storeTimeout:     DefaultStoreTimeout,
		maxBodyBytes:     DefaultMaxBodyBytes,
		maxResponseBytes: DefaultMaxResponseBytes,
		retryAfter:       DefaultRetryAfter,
		completionRetry:  DefaultCompletionRetry,
		storePolicy:      storable,
		unstored: map[string]bool{
			"Set-Cookie": true, "Date": true, "Content-Length": true, ReplayedHeader: true,
			// hop-by-hop, RFC 9110 section 7.6.1
			"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
			"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
		},
	}
}

// leaseFloorFactor: a lease must be at least this many store timeouts (see
// [WithLease] for the derivation).
const leaseFloorFactor = 4

func (c *config) validate() error {
	switch {
	case c.lease <= 0, c.retention <= 0, c.storeTimeout <= 0, c.retryAfter <= 0:
		return fmt.Errorf("idem: lease, retention, store timeout and Retry-After must be > 0")
	case c.lease < leaseFloorFactor*c.storeTimeout:
		return fmt.Errorf("idem: lease %v is below its floor %v (%d × the store timeout %v): "+
			"it could lapse before a renewal lands and let a duplicate execute; raise WithLease or lower WithStoreTimeout",
			c.lease, leaseFloorFactor*c.storeTimeout, leaseFloorFactor, c.storeTimeout)
	case c.wait < 0 || c.completionRetry < 0:
		return fmt.Errorf("idem: wait and completion retry must be >= 0")
	case c.maxBodyBytes <= 0 || c.maxResponseBytes <= 0:
		return fmt.Errorf("idem: body limits must be > 0")
	case c.header == "":
		return fmt.Errorf("idem: header name must not be empty")
	case len(c.badMethods) > 0:
		return fmt.Errorf("idem: WithMethods(%q): not an HTTP method token", c.badMethods[0])
	case c.keep.Uncertain < 0 || c.keep.Tombstone < 0:
		return fmt.Errorf("idem: WithUncertainAfterCrash and WithTombstones take a duration >= 0 (0: off)")
	}
	if err := c.validateRoutes(); err != nil {
		return err
	}
	return c.indexFingerprints()
}

// WithHeader sets the request header that carries the idempotency key.
// Optional. Default is "Idempotency-Key" (IETF draft section 2).
func WithHeader(name string) Option {
	return func(c *config) { c.header = http.CanonicalHeaderKey(name) }
}

// WithMethods adds methods to those covered by idempotency keys. Optional.
// Default is POST and PATCH (IETF draft section 1: PUT and DELETE are
// idempotent by definition); add PUT or DELETE here. The methods of RFC
// 9110 and PATCH are matched case-insensitively and stored in their
// canonical upper case ("put" covers PUT); other names are taken literally
// (methods are case-sensitive, RFC 9110 section 9.1) and must be tokens, or
// New returns an error. GET, HEAD, OPTIONS and TRACE are never covered and
// are ignored here.
func WithMethods(methods ...string) Option {
	return func(c *config) {
		for _, m := range methods {
			for _, std := range standardMethods {
				if strings.EqualFold(m, std) {
					m = std
				}
			}
			switch {
			case m == http.MethodGet, m == http.MethodHead, m == http.MethodOptions, m == http.MethodTrace:
			case !isToken(m):
				c.badMethods = append(c.badMethods, m)
			default:
				c.methods[m] = true
			}
		}
	}
}

var standardMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace}

// isToken reports whether s is an RFC 9110 token (section 5.6.2).
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if !tokenByte[s[i]] {
			return false
		}
	}
	return s != ""
}

// tokenByte tells the bytes of an RFC 9110 token (tchar, section 5.6.2).
var tokenByte = func() (t [256]bool) {
	for c := '!'; c < 0x7f; c++ {
		t[c] = !strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c)
	}
	return t
}()

// WithLease sets how long an in-progress record locks its key before another
// request may take it over; it is renewed every lease/3 while the handler runs
// (stores implementing [Extender]), so it only needs to outlast a crashed
// process's silence, not the slowest handler. Optional. Default is 30s.
//
// It must be at least 4 × the store timeout ([WithStoreTimeout]), else
// [New] returns an error. Derivation: with store timeout T, the longest gap
// between two writes of the lease in the store is T (the acquire's reply
// may take that long, and renewal is timed from it) + lease/3 (the renewal
// period) + T (the renewal's own round trip). That gap stays below the lease
// only if lease > 3T; 4T keeps a margin of lease/6 for scheduling delays
// and clock-rate differences between the process and the store. The same
// floor applies to stores that do no I/O. Below it a live handler's key can
// be taken over and executed twice (a 1ms lease lets sequential retries all
// execute).
func WithLease(d time.Duration) Option { return func(c *config) { c.lease = d } }

// WithRetention sets how long a completed response is replayed, counted from
// completion and never extended by replays. Optional. Default is 24h (Stripe
// keeps keys at least 24 hours).
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithStoreTimeout bounds every store operation; a store that doesn't answer in
// time counts as unavailable (503). Completion runs detached from the request
// context under this timeout, so a client that hangs up doesn't lose the
// result. Calls made without a cancellable context (completion, renewal,
// or a request context that cannot be cancelled) share a deadline with the
// calls started within d/16 of them, so each gets between 15/16 of d and d.
// Optional. Default is 2s.
func WithStoreTimeout(d time.Duration) Option { return func(c *config) { c.storeTimeout = d } }

// WithMaxBodyBytes sets the largest request body, in bytes, that a covered
// request may carry; a larger one is answered with 413 and not executed.
// Optional. Default is 1 MiB.
func WithMaxBodyBytes(n int64) Option { return func(c *config) { c.maxBodyBytes = n } }

// WithMaxResponseBytes sets the largest response body, in bytes, that is
// stored. A larger response is still sent in full to the first caller; its
// record is completed without the body, and replays answer 410 (problem type
// "response-not-stored") carrying the original status and Location, so the
// request is never executed twice nor replayed truncated. Optional. Default is 1 MiB.
func WithMaxResponseBytes(n int) Option { return func(c *config) { c.maxResponseBytes = n } }

// WithWait makes a duplicate that arrives while the first request is in
// progress wait up to d for it to finish and then get its replay (or execute,
// if the first was released), instead of an immediate 409. Optional. Default
// is 0: answer 409 at once (IETF draft section 2.7, Stripe).
//
// A 409's Retry-After tells what the engine knows of the holder (stores
// that report [Record.LeaseLeft] and renew leases): while the holder
// renews its lease, the short [WithRetryAfter] delay, since its answer may
// come any moment; once it has stopped renewing (its lease not extended
// for longer than a renewal period, lease/3, plus 2 store timeouts: it
// crashed or stalls), the time left on its lease, rounded up to whole
// seconds, at least the short delay and at most the route's lease, so
// clients stop polling a request that can only end by its lease lapsing.
func WithWait(d time.Duration) Option { return func(c *config) { c.wait = d } }

// WithCompletionRetry sets how long a completion that failed on a store
// error is retried in the background (with backoff from 50ms to 2s) while the
// lease stays renewed, so that a store blip after the handler ran doesn't let
// a retry execute it again; duplicates get 409 meanwhile. It can only help
// while the lease survives in the store. 0 disables it: one attempt, then
// the key stays in progress until the lease lapses. [Engine.Close] stops the
// retries. Optional. Default is 1 minute.
func WithCompletionRetry(d time.Duration) Option { return func(c *config) { c.completionRetry = d } }

// WithRetryAfter sets the Retry-After value of 503 answers and of 409
// answers while the holder renews its lease (see [WithWait] for a holder
// that stopped), rounded up to whole seconds. Optional. Default is 1s.
func WithRetryAfter(d time.Duration) Option { return func(c *config) { c.retryAfter = d } }

// WithStoreAll stores every response the handler produced, 5xx included, as
// Stripe does once execution has started ("Stripe mode"); it is
// WithStorePolicy with a policy that stores everything. Handler errors
// without a response and panics still release the key. Optional. Default is
// off: 5xx, 408, 409, 425 and 429 release the key so that a retry executes again.
func WithStoreAll() Option { return func(c *config) { c.storePolicy = func(int) bool { return true } } }

// WithStorePolicy sets the function deciding, from the handler's final
// status, whether its response is stored and replayed (true) or the key is
// released so that a retry executes again (false), e.g. releasing 400 and
// 404 too, as Stripe does not store requests that failed validation before
// executing. It must be safe for concurrent use. Optional. Default stores
// 2xx, 3xx and 4xx except 408, 409, 425 and 429, and releases 5xx.
func WithStorePolicy(store func(status int) bool) Option {
	return func(c *config) { c.storePolicy = store }
}

// WithKeyOptional lets covered requests without an idempotency key run
// unprotected instead of being answered 400 "key-missing", for rolling idem
// out on an API whose clients don't send keys yet (Fiber's idempotency
// middleware and Stripe pass such requests through). Each is reported as
// [EventUnprotected], so the share of clients still without keys can be
// watched. Malformed keys are still refused. Optional. Default is off (IETF
// draft section 2.7: a missing key is a client error).
func WithKeyOptional() Option { return func(c *config) { c.keyOptional = true } }

// WithKeyValidator sets a check of the idempotency key's form, run after
// the draft's syntax (section 2) is verified, on the key as parsed (quotes
// of an sf-string removed), e.g. requiring a UUID (Fiber's
// KeyHeaderValidate). A non-nil error refuses the request with 400
// "key-malformed", whose detail carries the error's text (so it must not
// echo secrets). It must be safe for concurrent use. Optional. Default is
// none: any 1 to 255 visible ASCII characters.
func WithKeyValidator(fn func(key string) error) Option {
	return func(c *config) { c.keyValidator = fn }
}

// WithProblemRenderer renders the errors idem answers itself (400, 401,
// 409, 410, 413, 422, 500, 503) in the app's own error format: fn returns
// the Content-Type and body for p; status, Retry-After and Location stay
// idem's. It is called once per fixed answer when the engine is built,
// and per answer for refused keys and responses not stored (the 409s'
// Retry-After values reuse its body). Optional. Default
// is RFC 9457 application/problem+json (Problem.Response).
func WithProblemRenderer(fn func(p Problem) (contentType string, body []byte)) Option {
	return func(c *config) { c.renderProblem = fn }
}

// WithFailOpen runs the handler unprotected when the store fails, logging each
// occurrence at error level, instead of answering 503. Optional. Default is
// off (fail closed): a store outage can never cause a duplicate execution.
func WithFailOpen() Option { return func(c *config) { c.failOpen = true } }

// WithGlobalScope declares that the service has no principals (one tenant,
// or unauthenticated endpoints such as sign-up), so keys are scoped by method
// and route only. Without it a request whose adapter reports no principal is
// answered with 401. Optional. Default is off.
func WithGlobalScope() Option { return func(c *config) { c.globalScope = true } }

// WithUnstoredHeaders adds response header names that are neither stored nor
// replayed. Optional. Always excluded: Set-Cookie, Date, Content-Length
// (recomputed), Idempotent-Replayed and the hop-by-hop headers of RFC 9110
// section 7.6.1, and any line already on the response when idem began that
// the handler left unchanged (set by middleware outside idem for this
// exchange: CORS, request ids; a replay carries what that middleware sets
// for the new exchange).
func WithUnstoredHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.unstored[http.CanonicalHeaderKey(n)] = true
		}
	}
}

// WithStoredHeaders stores and replays only the response header names given
// (an allowlist, like the KeepResponseHeaders of Fiber's idempotency
// middleware); the exclusions of [WithUnstoredHeaders] still apply. Calls
// add up. Optional. Default is every name not excluded.
func WithStoredHeaders(names ...string) Option {
	return func(c *config) {
		if c.stored == nil {
			c.stored = make(map[string]bool, len(names))
		}
		for _, n := range names {
			c.stored[http.CanonicalHeaderKey(n)] = true
		}
	}
}

// WithLogger sets the logger for store errors, fail-open runs and lost
// leases. Keys are logged hashed, never raw. Optional. Default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithEventHook calls fn synchronously for every [Event], e.g. to count
// metrics; fn must be fast and safe for concurrent use. Optional. Default is none.
func WithEventHook(fn func(context.Context, Event)) Option {
	return func(c *config) { c.onEvent = fn }
}

// WithUncertainAfterCrash chooses at-most-once recovery: a record whose
// lease lapsed without a completion (its holder crashed, or stalled past
// the lease without renewing) becomes uncertain ([StateUncertain]) for
// keep, instead of being taken over by the next request. Retries get 409
// "operation-uncertain" without Retry-After, telling the client not to
// retry automatically, until an operator who learned the outcome resolves
// the record (cmd/idemctl release, complete or evict) or keep ends (then
// the key is free). Use it where a second execution after a crash is worse
// than a stuck key: effects outside the store's transaction, such as a
// card charged through an external API. Under a [Transactional] store's
// unit (pgstore.Tx, mysqlstore.Tx) takeover is exactly-once already: the
// crashed execution's writes rolled back. The store must implement
// [Keeper], else [New] returns an error; a [LocalStore] never has a lapsed
// lease (its leases end with the process). keep 0 leaves it off; a
// negative keep makes [New] fail. Optional. Default is takeover.
func WithUncertainAfterCrash(keep time.Duration) Option {
	return func(c *config) { c.keep.Uncertain = keep }
}

// WithTombstones keeps, after a completed record's retention ends, a
// tombstone of it (scoped key and fingerprint, no response) for keep more:
// a retry in that window gets 410 "key-expired" (the key was used, its
// response is no longer stored, do not retry with it) instead of a second
// execution, as the IETF draft's open issue on expired keys and adcp-go's
// IDEMPOTENCY_EXPIRED suggest; another request with the key still gets
// 422. The store must implement [Keeper], else [New] returns an error.
// Its cost per tombstone is in each store's README. keep 0 leaves it
// off; a negative keep makes [New] fail. Optional. Default is none: after
// the retention the key executes again.
func WithTombstones(keep time.Duration) Option {
	return func(c *config) { c.keep.Tombstone = keep }
}
