package idem

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// RecoveryHeader is the request header that marks a request the
// [Recoverer] rebuilt from a recovery payload and runs through the
// service's own handler chain. Its value is a nonce of 128 random bits
// that only this process's recoverer knows while the run is pending: the
// engine adopts the recoverer's claim for a request carrying a pending
// nonce whose scoped key and fingerprint match, and refuses any other
// value with 403 "recovery-refused", executing nothing. A client cannot
// make a request a recovery run by sending it.
const RecoveryHeader = "Idem-Recovery"

// credentialHeaders are request header names a recovery payload never
// holds, whatever a route declares: the stored principal is re-established
// by the service's own hook ([Engine.RecoveryPrincipal]), never by a
// replayed credential.
var credentialHeaders = map[string]bool{
	"Authorization": true, "Proxy-Authorization": true, "Cookie": true,
	"X-Api-Key": true, "X-Auth-Token": true, "X-Csrf-Token": true, "X-Xsrf-Token": true,
}

// RouteRecovery makes the route recoverable: from the acquire on, the
// engine keeps in the record what a [Recoverer] needs to run the request
// again when its holder stopped (crashed, or stalled past its lease) and
// no client comes back: method, route, path, query, Content-Type,
// principal, idempotency key, the request header lines named in headers
// (an allow-list; Authorization, Proxy-Authorization, Cookie, X-Api-Key,
// X-Auth-Token and CSRF tokens are refused: [New] returns an error), and
// the body. Credentials are never stored: the recovery run reaches the
// handler through the service's authentication, which calls
// [Engine.RecoveryPrincipal] to re-establish the stored principal.
//
// The payload is written with one [Recoverable.SetRecovery] before the
// handler runs; when that fails the key is released (its lease lapses
// instead after a takeover, keeping the journal) and the request is
// answered 503 "store-unavailable": a recoverable route never runs its
// handler unrecoverable. A request whose payload would exceed
// [MaxRecoveryBytes] is answered 413 "body-too-large" before anything is
// stored. The store must implement [Recoverable] and [Journal], and the
// engine must not use [WithUncertainAfterCrash] (a lapsed record there
// turns uncertain instead of being recovered): else [New] returns an
// error. Default is the engine's [WithRecovery], else off.
func RouteRecovery(headers ...string) RouteOption {
	return func(p *routePolicy) {
		p.recover, p.recoverSet = true, true
		p.recoverHeaders = canonicalNames(p.recoverHeaders, headers)
	}
}

// WithRecovery makes every route recoverable ([RouteRecovery], with the
// request header names given), unless its [WithRoute] sets its own
// recovery. Optional. Default is off: routes opt in with [RouteRecovery],
// [Do] operations with [Operation.Recover].
func WithRecovery(headers ...string) Option {
	return func(c *config) {
		c.recover = true
		c.recoverHeaders = canonicalNames(c.recoverHeaders, headers)
	}
}

func canonicalNames(to, names []string) []string {
	for _, n := range names {
		to = append(to, http.CanonicalHeaderKey(n))
	}
	return to
}

// checkRecovery validates the recovery options: no credential header, no
// uncertain-after-crash.
func (c *config) checkRecovery() (any bool, err error) {
	check := func(where string, headers []string) error {
		for _, h := range headers {
			if credentialHeaders[h] || h == c.header || h == RecoveryHeader {
				return fmt.Errorf("idem: %s: header %q is never kept for recovery (credentials are re-established by the service's hook, Engine.RecoveryPrincipal)", where, h)
			}
		}
		return nil
	}
	if c.recover {
		any = true
		if err := check("WithRecovery", c.recoverHeaders); err != nil {
			return true, err
		}
	}
	for k, p := range c.routes {
		if p.recover {
			any = true
			if err := check(fmt.Sprintf("WithRoute(%q, %q)", k.method, k.route), p.recoverHeaders); err != nil {
				return true, err
			}
		}
	}
	if any && c.keep.Uncertain > 0 {
		return true, errors.New("idem: recovery (WithRecovery, RouteRecovery) and WithUncertainAfterCrash exclude each other: " +
			"a lapsed record there turns uncertain instead of being recovered; use Step with Repeatable steps for at-most-once effects")
	}
	return any, nil
}

// Recovery payloads: a magic, a version, a kind, then the fields as
// length-prefixed strings, the body (or an operation's payload) last.
const (
	recoveryMagic   = "iR\x01"
	recoveryHTTP    = 'h'
	recoveryOp      = 'd'
	recoveryMaxHdrs = 64
)

// recoveryRequest is what a recovery payload holds: an HTTP request
// (Kind recoveryHTTP) or an [Operation] (recoveryOp: Method is the scope,
// Route the name, Path the input, Key the key, Body the payload).
type recoveryRequest struct {
	Kind                                 byte
	Method, Route, Path, RawQuery, CType string
	Principal, Key                       string
	Header                               http.Header
	Body                                 []byte
}

// recoverySize returns the size of req's payload for route pol, without
// encoding it.
func recoverySize(req *Request, route, key string, pol *routePolicy) int {
	n := len(recoveryMagic) + 1 + 8*10
	n += len(req.Method) + len(route) + len(req.Path) + len(req.RawQuery) + len(req.ContentType) + len(req.Principal) + len(key)
	for _, name := range pol.recoverHeaders {
		for _, v := range req.Header[name] {
			n += len(name) + len(v) + 20
		}
	}
	return n + len(req.Body)
}

func encodeRecovery(r *recoveryRequest) []byte {
	b := make([]byte, 0, 128+len(r.Body))
	b = append(b, recoveryMagic...)
	b = append(b, r.Kind)
	for _, s := range []string{r.Method, r.Route, r.Path, r.RawQuery, r.CType, r.Principal, r.Key} {
		b = appendString(b, s)
	}
	lines := 0
	for _, vs := range r.Header {
		lines += len(vs)
	}
	b = binary.AppendUvarint(b, uint64(lines))
	for k, vs := range r.Header {
		for _, v := range vs {
			b = appendString(appendString(b, k), v)
		}
	}
	return append(b, r.Body...)
}

func decodeRecovery(p []byte) (*recoveryRequest, error) {
	if len(p) < len(recoveryMagic)+1 || string(p[:len(recoveryMagic)]) != recoveryMagic {
		return nil, fmt.Errorf("%w: recovery payload of another version", ErrCorrupt)
	}
	r := &recoveryRequest{Kind: p[len(recoveryMagic)]}
	d := decoder{b: p[len(recoveryMagic)+1:]}
	field := func() string {
		n := d.uvarint()
		if d.err || n > uint64(len(d.b)) {
			d.err = true
			return ""
		}
		s := string(d.b[:n])
		d.b = d.b[n:]
		return s
	}
	for _, s := range []*string{&r.Method, &r.Route, &r.Path, &r.RawQuery, &r.CType, &r.Principal, &r.Key} {
		*s = field()
	}
	lines := d.uvarint()
	if lines > recoveryMaxHdrs*4 {
		d.err = true
	}
	for i := uint64(0); i < lines && !d.err; i++ {
		if r.Header == nil {
			r.Header = http.Header{}
		}
		k, v := field(), field()
		r.Header[k] = append(r.Header[k], v)
	}
	if d.err || (r.Kind != recoveryHTTP && r.Kind != recoveryOp) {
		return nil, fmt.Errorf("%w: recovery payload", ErrCorrupt)
	}
	r.Body = d.b
	return r, nil
}

// pendingClaim is a record a [Recoverer] claimed and runs again, waiting
// for the engine to adopt it: through [RecoveryHeader]'s nonce (HTTP) or
// the context (Do).
type pendingClaim struct {
	key, token, fp, principal string
	method, route             string
	attempts                  int
	adopted                   chan *Execution // gets the execution once adopted (capacity 1)
	taken                     atomic.Bool     // adopted (Do: nested calls see the claim in ctx and ignore it)
}

// pending are the claims of this process's recoverers, by nonce.
type pending struct {
	mu sync.Mutex
	m  map[string]*pendingClaim
}

func (p *pending) add(c *pendingClaim) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	nonce := hex.EncodeToString(b[:])
	p.mu.Lock()
	if p.m == nil {
		p.m = map[string]*pendingClaim{}
	}
	p.m[nonce] = c
	p.mu.Unlock()
	return nonce
}

func (p *pending) get(nonce string) *pendingClaim {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[nonce]
}

func (p *pending) take(nonce string) *pendingClaim {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.m[nonce]
	delete(p.m, nonce)
	return c
}

// RecoveryPrincipal returns the principal stored with the recovery run
// whose [RecoveryHeader] value is nonce, ok = true only while that run is
// pending in this process (a [Recoverer] of this engine rebuilt the
// request and runs it). The service's authentication middleware calls it
// for a request carrying the header, instead of its credential check, and
// authenticates the request as that principal; for any other value
// (absent, forged, already used, from another process) ok is false and
// the middleware authenticates the request as usual, so no request a
// client can send skips authentication:
//
//	if p, ok := eng.RecoveryPrincipal(r.Header.Get(idem.RecoveryHeader)); ok {
//		ctx = withUser(ctx, p) // the principal the adapter's scope function returns
//	} else {
//		// check the credential
//	}
func (e *Engine) RecoveryPrincipal(nonce string) (principal string, ok bool) {
	if nonce == "" {
		return "", false
	}
	c := e.pending.get(nonce)
	if c == nil {
		return "", false
	}
	return c.principal, true
}

// RecoveryHeaders returns the request header names the route (method and
// template as the adapter reports it) keeps for recovery, nil when it is
// not recoverable: for adapters of frameworks with their own header type,
// which fill [Request.Header] with these names only.
func (e *Engine) RecoveryHeaders(method, route string) []string {
	pol := e.route(method, route)
	if !pol.recover {
		return nil
	}
	if pol.recoverHeaders == nil {
		return []string{}
	}
	return pol.recoverHeaders
}

// Recovers reports whether requests of the route recover ([RouteRecovery],
// [WithRecovery]).
func (e *Engine) Recovers(method, route string) bool { return e.route(method, route).recover }

// sfString returns key as an RFC 8941 sf-string, which [ParseKey] reads
// back as key.
func sfString(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

// setRecovery stores x's recovery payload; on failure x ends without
// running its handler (released, or left to lapse after a takeover).
func (e *Engine) setRecovery(ctx context.Context, x *Execution, payload []byte) error {
	start := e.clock()
	var err error
	if e.local {
		err = e.recoverable.SetRecovery(ctx, x.ev.Key, x.token, payload, x.pol.retention, x.pol.lease)
	} else {
		c, cancel := e.storeCall(ctx)
		err = e.recoverable.SetRecovery(c, x.ev.Key, x.token, payload, x.pol.retention, x.pol.lease)
		cancel()
	}
	if err == nil {
		return nil
	}
	ev := x.ev
	ev.Op, ev.StoreDuration = OpSetRecovery, e.clock().Sub(start)
	e.emitErr(ctx, ev, EventStoreError, err, "idem: storing the recovery payload failed; the handler does not run")
	if x.tookOver {
		x.abandon() // keep the journal: the lease lapses
	} else {
		x.Fail()
	}
	return err
}

// adopt runs, for a request carrying [RecoveryHeader], the execution its
// recoverer claimed: the nonce must be pending, and the request's scoped
// key and fingerprint those of the claimed record; else 403
// "recovery-refused", nothing executed.
func (e *Engine) adopt(ctx context.Context, req *Request, route, key string, pol *routePolicy) (*Execution, *Response) {
	c := e.pending.take(req.Recovery)
	ev := Event{Method: req.Method, Route: req.Route}
	if c == nil {
		ev.Kind, ev.Err = EventRecoveryRefused, errRecoveryUnknown
		e.cfg.logger.WarnContext(ctx, "idem: refused a request carrying an unknown Idem-Recovery nonce (forged, reused, or from another process); nothing executed",
			"method", req.Method, "route", req.Route)
		e.emit(ctx, ev)
		return nil, e.problems.recoveryRefused
	}
	scoped, fp, _ := e.ids(req, route, key, &pol.fingerprint)
	ev.Key = scoped
	if scoped != c.key || fp != c.fp {
		ev.Kind, ev.Err = EventRecoveryRefused, errRecoveryMismatch
		e.cfg.logger.WarnContext(ctx, "idem: a recovery run reached the engine as another request (principal, route or body differ: does the authentication middleware call Engine.RecoveryPrincipal?); nothing executed",
			"key", c.key, "method", req.Method, "route", req.Route)
		e.emit(ctx, ev)
		return nil, e.problems.recoveryRefused
	}
	c.taken.Store(true)
	return e.adopted(ctx, ev, pol, c), nil
}

var (
	errRecoveryUnknown  = errors.New("idem: unknown recovery nonce")
	errRecoveryMismatch = errors.New("idem: recovery run does not match its claim")
)

// adopted returns the execution of claim c, holding its lease (renewed
// from now on), and tells c's recoverer.
func (e *Engine) adopted(ctx context.Context, ev Event, pol *routePolicy, c *pendingClaim) *Execution {
	ev.Key = c.key
	x := &Execution{e: e, pol: pol, token: c.token, fp: c.fp, ev: ev, started: e.clock(), recovering: true, tookOver: true,
		recovered: make(chan error, 1)}
	x.detached.parent = ctx
	x.ctx = &x.detached
	e.emit(ctx, x.event(EventAcquired))
	x.startRenewal()
	c.adopted <- x
	return x
}

type recoveryCtxKey struct{}

// adoptOp returns the execution of the claim ctx carries for the operation
// with scoped key and fingerprint fp ([Recoverer.Handle]), nil when ctx
// carries none, or an error when it carries another's.
func (e *Engine) adoptOp(ctx context.Context, ev Event, key, fp string) (*Execution, error) {
	c, ok := ctx.Value(recoveryCtxKey{}).(*pendingClaim)
	if !ok {
		return nil, nil
	}
	if c.taken.Load() {
		return nil, nil
	}
	if c.key != key || c.fp != fp {
		return nil, fmt.Errorf("idem: the recovery function called Do with another operation than the one recovered (scope, name, key and payload must be the Operation it was given): %w", errRecoveryMismatch)
	}
	if c.taken.Swap(true) { // adopted already: a Do nested in the recovered one's function
		return nil, nil
	}
	return e.adopted(ctx, ev, &e.cfg.policy, c), nil
}

// abandon ends x without completing or releasing it: its lease lapses
// (at once where the store can shorten it, [Extender]; else at its term),
// and the record, its journal and recovery payload are kept for a
// takeover (the client's retry) or a [Recoverer]. It reports
// [EventRecoveryDeferred] for a Recoverer's run, else [EventAbandoned],
// and remembers x's token so that the takeover from it is logged as a
// resume, not a crash (reportTakeover).
func (x *Execution) abandon() {
	x.stopRenewal()
	if x.unit != nil {
		if r, ok := x.unit.(RollbackUnit); ok {
			ctx, cancel := x.e.storeCall(x.ctx)
			_ = r.Rollback(ctx)
			cancel()
		}
	}
	if x.e.extender != nil {
		ctx, cancel := x.ctx, context.CancelFunc(func() {})
		if !x.e.local {
			ctx, cancel = x.e.storeCall(x.ctx)
		}
		_ = x.e.extender.Extend(ctx, x.ev.Key, x.token, time.Millisecond) // let it lapse now, not a lease from now
		cancel()
	}
	ev := x.ended(x.ev, 0, 0)
	ev.Kind = EventRecoveryDeferred
	err := errRecoveryDeferred
	if !x.recovering {
		ev.Kind, err = EventAbandoned, errAbandoned
		x.e.firstReport(abandonedName(x.token))
	}
	x.e.emit(x.ctx, ev)
	x.recycle()
	x.tell(err)
	if x.reported != nil {
		x.reported(err)
	}
}

// abandonedName is the name under which firstReport remembers a token
// whose execution this engine abandoned with its journal, for
// reportTakeover.
func abandonedName(token string) string { return "abandoned:" + token }

var (
	errRecoveryDeferred = errors.New("idem: the recovery run did not end the execution; it is due again after its backoff")
	errRecoveryReleased = errors.New("idem: the recovery run released the execution")
	errAbandoned        = errors.New("idem: the execution ended without an answer to store; its lease lapses and its journal is kept for the retry")
)

// tell tells x's recoverer how x ended (nil: stored).
func (x *Execution) tell(err error) {
	if x.recovered != nil {
		select {
		case x.recovered <- err:
		default:
		}
	}
}

// RollbackUnit is implemented by the [Unit]s of [Transactional] stores
// that can roll the handler's writes back without releasing the record:
// the engine calls Rollback when a recovery run ([Recoverer]), a
// takeover, or an execution in which a [Step] finished ends without a
// storable answer, keeping the record, its journal and its recovery
// payload for the next attempt. A Unit without it is released (Release:
// its journal goes with it, and a retry runs its steps again) in that case.
type RollbackUnit interface {
	Unit
	// Rollback rolls the handler's writes back and ends the unit; the
	// record is left as it is.
	Rollback(ctx context.Context) error
}

// httpRecovery returns the recovery payload of req on route.
func (e *Engine) httpRecovery(req *Request, route, key string, pol *routePolicy) []byte {
	r := recoveryRequest{Kind: recoveryHTTP, Method: req.Method, Route: route, Path: req.Path, RawQuery: req.RawQuery,
		CType: req.ContentType, Principal: req.Principal, Key: key, Body: req.Body}
	for _, name := range pol.recoverHeaders {
		if v := req.Header[name]; len(v) > 0 {
			if r.Header == nil {
				r.Header = http.Header{}
			}
			r.Header[name] = v
		}
	}
	return encodeRecovery(&r)
}
