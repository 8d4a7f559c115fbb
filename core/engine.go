package idem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Request is what an adapter tells the [Engine] about one HTTP request.
// Begin keeps Method and Route (copy them if the framework reuses their
// memory); the other fields are only read during Begin, so they may alias
// request buffers.
type Request struct {
	// Method is the HTTP method, e.g. "POST".
	Method string
	// Route is the route template the framework matched, e.g. "/v1/payments/:id";
	// empty means Path. It is part of the scope.
	Route string
	// Path and RawQuery are the request target, part of the fingerprint.
	Path     string
	RawQuery string
	// ContentType is the Content-Type header value, part of the fingerprint.
	ContentType string
	// Keys holds the values of every idempotency key header line, in order.
	Keys []string
	// Principal identifies who is calling (user, account, API client), taken
	// from the framework's own context after authentication; it is part of the
	// scope. Empty is refused with 401 unless [WithGlobalScope] is set.
	Principal string
	// Body is the raw request body. When BodyReader is set instead, Begin reads
	// at most the body limit from it and sets Body, so the adapter can hand
	// the same bytes to the handler.
	Body       []byte
	BodyReader io.Reader
	// Header holds the request's header lines; it is read only for a
	// recoverable route ([RouteRecovery]), for the names it declares
	// ([Engine.RecoveryHeaders]). Optional otherwise.
	Header http.Header
	// Recovery is the value of the request's [RecoveryHeader], "" when
	// absent: a request a [Recoverer] rebuilt carries its pending nonce.
	Recovery string

	bodyHint int64       // BodyReader's length + 1 when known (BeginHTTP: Content-Length), else 0
	handBack bool        // BeginHTTP: the body read from BodyReader goes back to the handler in a bodyBuffer
	handed   *bodyBuffer // with handBack, the bodyBuffer made with room for the body, or nil
}

// Engine decides, for each request, one of: pass through, reject, replay, or
// execute and record. It holds all policy (keys, scope, fingerprint, which
// responses and header lines are stored); adapters only translate between
// their framework and [Engine.Begin] and the [Execution] it returns. An
// Engine is safe for concurrent use. Besides the lease renewals of running
// executions (see [Extender]: one goroutine for all of them, while there
// are any), it runs goroutines only to retry completions that failed on a
// store error ([WithCompletionRetry]) and to release leases a failed store
// call may have left; [Engine.Close] stops them.
type Engine struct {
	store       Store
	extender    Extender
	tx          Transactional // nil unless the store offers transactional completion
	keeper      Keeper        // set when the engine keeps records (WithUncertainAfterCrash, WithTombstones)
	journal     Journal       // the store's step journal (Step), nil when it has none
	recoverable Recoverable   // the store's recovery (WithRecovery, RouteRecovery, Operation.Recover), nil when it has none
	maxLease    time.Duration // the longest lease of any route: a recoverer's claim of a record stored without its own takes it
	pending     pending       // recovery runs of this process's recoverers, by nonce
	local       bool          // the store does no I/O: no timeout contexts
	cfg         config

	deadlines *deadlines // of store calls (storeCall)
	renewals  renewals   // the lease renewals of running executions

	tokenPrefix string
	tokens      atomic.Uint64
	releasers   atomic.Int64 // background releases under way
	problems    problems

	unreadableMu sync.Mutex
	unreadable   map[string]struct{} // keys logged once: unreadable, or "uncertain:"+key; "suspended:"+token (firstReport)

	mu        sync.Mutex // guards closed and wg.Add
	closed    bool
	wg        sync.WaitGroup // background completion retries and releases
	draining  chan struct{}  // closed by Close: background releases try now
	drainOnce sync.Once
	closing   chan struct{} // closed when Close's ctx is done: background work stops
	closeOnce sync.Once
}

// New returns an Engine backed by store, configured by opts. It does no
// I/O. It returns an error when store is nil or an option is out of range:
// durations and limits must be > 0 (wait and completion retry >= 0), the
// lease at least 4 store timeouts, the header name not empty, and methods
// HTTP tokens.
func New(store Store, opts ...Option) (*Engine, error) {
	if store == nil {
		return nil, errors.New("idem: nil store")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	e := &Engine{store: store, cfg: cfg, problems: newProblems(cfg.retryAfter, cfg.renderProblem), closing: make(chan struct{}), draining: make(chan struct{}), unreadable: map[string]struct{}{}, tokenPrefix: ownerPrefix()}
	e.deadlines = newDeadlines(cfg.storeTimeout)
	e.extender, _ = store.(Extender)
	e.tx, _ = store.(Transactional)
	e.journal, _ = store.(Journal)
	if cfg.keep != (Keep{}) {
		k, ok := store.(Keeper)
		if !ok {
			return nil, fmt.Errorf("idem: WithUncertainAfterCrash and WithTombstones need a store that implements idem.Keeper; %T does not", store)
		}
		e.keeper = k
	}
	if l, ok := store.(LocalStore); ok {
		e.local = l.Local()
	}
	e.recoverable, _ = store.(Recoverable)
	recovers, err := cfg.checkRecovery()
	switch {
	case err != nil:
		return nil, err
	case recovers && (e.recoverable == nil || e.journal == nil):
		return nil, fmt.Errorf("idem: recovery (WithRecovery, RouteRecovery) needs a store that implements idem.Recoverable and idem.Journal; %T does not", store)
	}
	e.maxLease = cfg.lease
	for _, p := range e.cfg.routes {
		e.maxLease = max(e.maxLease, p.lease)
	}
	return e, nil
}

// Header returns the canonical name of the idempotency key header, for
// adapters that fill [Request.Keys] from their framework's header type.
func (e *Engine) Header() string { return e.cfg.header }

// MustHaveScope panics, naming the fix, when an adapter is built without a
// scope function (has is false) for an engine without [WithGlobalScope]:
// every covered request would be answered 401 "no-principal". option names
// the adapter's scope option, e.g. "idemgin.WithScope". Adapters call it in
// their constructor, refusing misuse when the app is built (as
// http.ServeMux.Handle panics on a nil handler) rather than per request.
func (e *Engine) MustHaveScope(has bool, option string) {
	if !has && !e.cfg.globalScope {
		panic("idem: middleware built without a scope function: pass " + option +
			"(fn) returning the authenticated principal (mount it after authentication), or build the engine with idem.WithGlobalScope() if the service has no principals")
	}
}

// Covers reports whether requests with this method need an idempotency key.
// Adapters call it first so that other requests pass through untouched.
func (e *Engine) Covers(method string) bool { return e.cfg.methods[method] }

// Begin decides what to do with req; it is for adapter authors (see
// "Writing an adapter" in the package doc). It returns:
//   - nil, nil: pass through, run the handler unprotected (method not covered,
//     no key under [WithKeyOptional], or the store failed under [WithFailOpen]),
//     or as it is when ctx already belongs to an execution of this engine
//     (the engine mounted twice on one request: the outer mount records it);
//   - nil, resp: do not run the handler; write resp, which is either a replay
//     (carrying "Idempotent-Replayed: true") or an RFC 9457 problem. resp is
//     read-only and may be shared; write it with [Response.Send] (net/http)
//     or [Response.WriteLines] (a framework's own header type), or read its
//     header lines with [Response.EachHeader] (a replay's Header is nil);
//   - x, nil: run the handler, feed its body to x.Write, then call exactly
//     one of x.Finish (or x.FinishLines for a framework with its own header
//     type), x.Fail (handler error without a response) or x.Abort (panic).
//
// Answers: 400 missing or malformed key (or one the [WithKeyValidator]
// function refused), or unreadable body; 401 no principal;
// 413 body above the limit; 422 key reused with another fingerprint
// ("key-reused"), or with a record fingerprinted by a function this engine
// does not know ("fingerprint-changed", see [WithKnownFingerprints]); 409
// request with this key in progress (its Retry-After: see [WithWait]); 403 the [WithReplayCheck] function
// refused the replay, 409 or 422; 503 store unavailable; 500 the key's
// stored record is unreadable ([ErrCorrupt], even under [WithFailOpen]);
// 409 without Retry-After, "operation-uncertain", for a record whose holder
// crashed ([WithUncertainAfterCrash]); 410 "key-expired" for the tombstone
// of a key whose response is no longer stored ([WithTombstones]).
func (e *Engine) Begin(ctx context.Context, req *Request) (*Execution, *Response) {
	if !e.cfg.methods[req.Method] || e.executing(ctx) {
		return nil, nil
	}
	key, err := ParseKey(req.Keys)
	if errors.Is(err, ErrKeyMissing) && e.cfg.keyOptional {
		e.emit(ctx, Event{Kind: EventUnprotected, Method: req.Method, Route: req.Route})
		return nil, nil
	}
	if err != nil {
		e.emit(ctx, Event{Kind: EventRejected, Method: req.Method, Route: req.Route, Err: err})
		return nil, e.problems.forKeyError(err)
	}
	if e.cfg.keyValidator != nil {
		if err := e.cfg.keyValidator(key); err != nil {
			e.emit(ctx, Event{Kind: EventRejected, Method: req.Method, Route: req.Route, Err: err})
			return nil, e.problems.refusedKey(err)
		}
	}
	if req.Principal == "" && !e.cfg.globalScope {
		e.emit(ctx, Event{Kind: EventRejected, Method: req.Method, Route: req.Route})
		return nil, e.problems.noPrincipal
	}
	if req.BodyReader != nil {
		var into []byte
		if req.handBack && req.bodyHint > 0 && req.bodyHint-1 <= e.cfg.maxBodyBytes {
			req.handed, into = newBodyBuffer(req.bodyHint - 1)
		}
		req.Body, err = readBody(req.BodyReader, e.cfg.maxBodyBytes, req.bodyHint, into)
		req.BodyReader = nil
		if err != nil {
			e.emit(ctx, Event{Kind: EventRejected, Method: req.Method, Route: req.Route, Err: err})
			return nil, e.problems.badBody
		}
	}
	if int64(len(req.Body)) > e.cfg.maxBodyBytes {
		e.emit(ctx, Event{Kind: EventRejected, Method: req.Method, Route: req.Route})
		return nil, e.problems.tooLarge
	}
	route := req.Route
	if route == "" {
		route = req.Path
	}
	pol := e.route(req.Method, route)
	if req.Recovery != "" {
		return e.adopt(ctx, req, route, key, pol)
	}
	if pol.recover && recoverySize(req, route, key, pol) > MaxRecoveryBytes {
		e.emit(ctx, Event{Kind: EventRejected, Method: req.Method, Route: req.Route, Err: ErrTooLarge})
		return nil, e.problems.tooLargeToRecover
	}
	scoped, fp, token := e.ids(req, route, key, &pol.fingerprint)
	ev := Event{Key: scoped, Method: req.Method, Route: req.Route} // the template only: a path may be unbounded
	x, rec, err := e.begin(ctx, &ev, pol, fp, token, req)
	switch {
	case x != nil && pol.recover:
		if e.setRecovery(ctx, x, e.httpRecovery(req, route, key, pol)) != nil {
			return nil, e.problems.unavailable
		}
		return x, nil
	case x != nil:
		return x, nil
	case errors.Is(err, errInProgress):
		if r := e.forbidden(ctx, req, ev, rec.State, 0, EventConflict); r != nil {
			return nil, r
		}
		ev.Kind = EventConflict
		e.emit(ctx, ev)
		return nil, e.problems.inProgressFor(e.conflictRetryAfter(pol.lease, rec.LeaseLeft))
	case errors.Is(err, errUncertain), errors.Is(err, errKeyExpired):
		resp := e.problems.uncertain
		ev.Kind = EventUncertain
		if rec.State == StateExpired {
			ev.Kind, resp = EventKeyExpired, e.problems.keyExpired
		}
		if r := e.forbidden(ctx, req, ev, rec.State, 0, ev.Kind); r != nil {
			return nil, r
		}
		if ev.Kind == EventUncertain {
			e.reportUncertain(ctx, ev)
		}
		e.emit(ctx, ev)
		return nil, resp
	case errors.Is(err, errMismatch):
		ev.Kind = EventMismatch
		resp := e.problems.mismatch
		if _, known := e.cfg.fingerprints[fingerprintID(rec.Fingerprint)]; !known {
			ev.Kind, resp = EventFingerprintChanged, e.problems.fingerprintChanged
		}
		if r := e.forbidden(ctx, req, ev, rec.State, 0, ev.Kind); r != nil {
			return nil, r
		}
		e.emit(ctx, ev)
		return nil, resp
	case errors.Is(err, ErrCorrupt):
		return nil, e.problems.unreadable
	case err != nil:
		if e.cfg.failOpen {
			e.cfg.logger.ErrorContext(ctx, "idem: store failed, running handler unprotected (fail-open)", "key", scoped[:16])
			return nil, nil
		}
		return nil, e.problems.unavailable
	}
	resp, err := sharedReplay(rec.Response, req.handBack)
	if err != nil {
		e.reportUnreadable(ctx, ev, err)
		return nil, e.problems.unreadable
	}
	if r := e.forbidden(ctx, req, ev, rec.State, resp.Status, EventReplayed); r != nil {
		return nil, r
	}
	ev.Kind = EventReplayed
	e.emit(ctx, ev)
	return nil, resp
}

// Outcomes of begin other than an execution or a completed record.
var (
	errInProgress = errors.New("idem: in progress")
	errMismatch   = errors.New("idem: fingerprint mismatch")
	errUncertain  = errors.New("idem: uncertain")
	errKeyExpired = errors.New("idem: key expired")
)

// begin takes the lease on ev.Key, under the route policy pol, for fingerprint fp and token, waiting
// ([WithWait]) while another execution holds it. It returns the execution
// (lease taken, renewal started), or the key's completed record (Response
// or Encoded set, undecoded; the caller reports the replay), or an error
// with the key's record: errInProgress, errMismatch, errUncertain or
// errKeyExpired (the caller reports them), one wrapping [ErrCorrupt] (already reported), or the store's own
// error (already reported; a release of the token's lease is scheduled).
// A stored fingerprint other than fp is a mismatch unless req (nil for
// [Do]) is the same request under the fingerprint function that made it.
// It emits acquired and store-error events; ev carries the key, method and
// route, and gets the last acquire's Op and StoreDuration.
func (e *Engine) begin(ctx context.Context, ev *Event, pol *routePolicy, fp, token string, req *Request) (*Execution, Record, error) {
	var deadline time.Time
	if e.cfg.wait > 0 {
		deadline = time.Now().Add(e.cfg.wait)
	}
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		start := e.clock()
		rec, acquired, err := e.acquire(ctx, ev.Key, token, fp, pol.lease)
		now := e.clock()
		ev.Op, ev.StoreDuration = OpAcquire, now.Sub(start)
		switch {
		case errors.Is(err, ErrCorrupt):
			e.reportUnreadable(ctx, *ev, err)
			return nil, Record{}, err
		case err != nil:
			e.emitErr(ctx, *ev, EventStoreError, err, "idem: acquire failed")
			e.releaseLater(ctx, *ev, token, pol.lease) // the acquire may still land: don't leave a lease nobody owns
			return nil, Record{}, err
		case acquired:
			tookOver := rec.State == StateInProgress && rec.Token != ""
			if tookOver {
				e.reportTakeover(ctx, *ev, rec)
			}
			x := &Execution{e: e, pol: pol, token: token, fp: fp, ev: *ev, started: now, tookOver: tookOver}
			x.detached.parent = ctx
			x.ctx = &x.detached
			e.emit(ctx, x.event(EventAcquired))
			x.startRenewal()
			return x, Record{}, nil
		case rec.Fingerprint != fp && (req == nil || !e.sameRequest(req, rec.Fingerprint, fp)):
			return nil, rec, errMismatch
		case rec.State == StateCompleted:
			return nil, rec, nil
		case rec.State == StateUncertain:
			return nil, rec, errUncertain
		case rec.State == StateExpired:
			return nil, rec, errKeyExpired
		}
		// In progress: wait for it when configured, else conflict.
		if deadline.IsZero() || time.Now().Add(pause).After(deadline) || sleep(ctx, pause) != nil {
			return nil, rec, errInProgress
		}
	}
}

// conflictRetryAfter returns the Retry-After, in whole seconds, of a 409
// for an in-progress record of a route with the given lease, whose store
// reported left on it ([Record.LeaseLeft]; 0: unknown). A holder that
// renews writes a full lease every lease/3, so its lease never has less
// than lease - lease/3 - 2 × the store timeout left (the acquire's reply
// and a renewal's round trip); with more left than that the holder may
// still be running and may answer any moment: the short [WithRetryAfter]
// delay. With less, it has stopped renewing (crashed, or its process
// stalls), and nothing can happen before the lease lapses: the time left,
// rounded up, at least the short delay and at most the lease. Stores that
// cannot renew or that die with the process ([LocalStore]) always get the
// short delay.
func (e *Engine) conflictRetryAfter(lease, left time.Duration) int64 {
	short := ceilSeconds(e.cfg.retryAfter)
	if left <= 0 || e.extender == nil || e.local || left > lease-lease/3-2*e.cfg.storeTimeout {
		return short
	}
	return max(short, min(ceilSeconds(left), ceilSeconds(lease)))
}

// ceilSeconds returns d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// executing reports whether ctx belongs to a handler that an execution of
// e already runs: the same engine mounted twice on one request (app-wide
// and again on a group, or a handler wrapped twice). The inner mount passes
// through, so the handler runs once and the outer mount records it;
// without this the inner mount would find the outer one's lease and
// answer every request 409.
func (e *Engine) executing(ctx context.Context) bool {
	p, ok := ctx.Value(infoKey{}).(*Info)
	return ok && p.engine == e
}

// maxUnreadableLogged bounds the keys remembered as logged (firstReport);
// past it the set starts again (a key may then be logged once more).
const maxUnreadableLogged = 1024

// reportUnreadable reports a key whose record the store cannot decode: an
// event every time, a log line (with the whole hashed key, which names the
// record to delete) once per key, so that clients retrying it don't flood
// the log.
func (e *Engine) reportUnreadable(ctx context.Context, ev Event, err error) {
	ev.Kind, ev.Err = EventStoreError, err
	if e.firstReport(ev.Key) {
		e.cfg.logger.ErrorContext(ctx, "idem: stored record unreadable; answering 500 until it is deleted from the store (README: Clearing an unreadable record)",
			"key", ev.Key, "method", ev.Method, "route", ev.Route, "err", err)
	}
	e.emit(ctx, ev)
}

// reportTakeover reports an acquisition that took a lapsed lease over
// from rec.Token's holder ([Journal] stores report it): an
// [EventTakeover] and a log line naming the whole key (idemctl show takes
// it) and the previous owner. When this engine itself left the record
// uncertain under that token (a step's outcome unknown, or recovery
// parked), an operator's [ResolveStep] made it due; when it abandoned the
// execution with its journal (a handler error after a [Step] finished),
// the retry resumes it: either way the line, at Info, reports a resume,
// not a crash.
func (e *Engine) reportTakeover(ctx context.Context, ev Event, rec Record) {
	ev.Kind, ev.PreviousOwner, ev.Lapsed = EventTakeover, rec.Token, -rec.LeaseLeft
	ev.Op, ev.StoreDuration = 0, 0 // the acquire is reported once, by EventAcquired
	owner := "unknown"
	if host, pid, ok := TokenOwner(rec.Token); ok {
		owner = host + ":" + strconv.Itoa(pid)
	}
	switch {
	case e.reported(suspendedName(rec.Token)):
		e.cfg.logger.InfoContext(ctx, "idem: resumed a record an operator resolved (idemctl resolve-step) after this process left it uncertain (not a crash); the handler resumes from its last journaled step (docs/runbook.md#uncertain-payment)",
			"key", ev.Key, "previous_owner", owner, "method", ev.Method, "route", ev.Route)
	case e.reported(abandonedName(rec.Token)):
		e.cfg.logger.InfoContext(ctx, "idem: resumed a record whose execution in this process ended without an answer after a journaled step (error, 5xx or panic; not a crash); the handler resumes from its last journaled step (README: Durable steps)",
			"key", ev.Key, "previous_owner", owner, "method", ev.Method, "route", ev.Route)
	default:
		e.cfg.logger.WarnContext(ctx, "idem: took over a lapsed lease; its holder stopped renewing it (crashed or stalled), or it was uncertain and an operator resolved a step (idemctl resolve-step); the handler runs again from its last journaled step (README: After a crash; docs/runbook.md#takeover-alert)",
			"key", ev.Key, "previous_owner", owner, "lapsed", ev.Lapsed, "method", ev.Method, "route", ev.Route)
	}
	e.emit(ctx, ev)
}

// suspendedName is the name under which firstReport remembers a token
// this engine suspended a record with (uncertain), for reportTakeover.
func suspendedName(token string) string { return "suspended:" + token }

// reportUncertain logs, once per key, a key found uncertain
// ([WithUncertainAfterCrash]), with the whole hashed key that idemctl
// resolves it by; the caller emits the event.
func (e *Engine) reportUncertain(ctx context.Context, ev Event) {
	if e.firstReport("uncertain:" + ev.Key) {
		e.cfg.logger.WarnContext(ctx, "idem: operation uncertain (its holder stopped mid-request); answering 409 until an operator resolves the key with idemctl release or complete (README: After a crash)",
			"key", ev.Key, "method", ev.Method, "route", ev.Route)
	}
}

// reported reports whether firstReport remembers name.
func (e *Engine) reported(name string) bool {
	e.unreadableMu.Lock()
	defer e.unreadableMu.Unlock()
	_, seen := e.unreadable[name]
	return seen
}

// firstReport reports whether name was not reported before, remembering
// it; past maxUnreadableLogged names the set starts again.
func (e *Engine) firstReport(name string) bool {
	e.unreadableMu.Lock()
	defer e.unreadableMu.Unlock()
	if _, seen := e.unreadable[name]; seen {
		return false
	}
	if len(e.unreadable) >= maxUnreadableLogged {
		clear(e.unreadable)
	}
	e.unreadable[name] = struct{}{}
	return true
}

// ids returns the scoped key ([ScopedKey]), the fingerprint by f
// ([Fingerprint] for the default) and a new lease token for req, sliced from one string (one allocation).
// The token is one no other execution of any engine uses: a random
// per-engine prefix and a counter (tokens identify lease owners; they are
// never shown to clients, so they need to be unique, not secret).
func (e *Engine) ids(req *Request, route, key string, f *Fingerprinter) (scoped, fp, token string) {
	var stack [256]byte
	b := appendHex(stack[:0], scopedSum(req.Principal, req.Method, route, key))
	if f.id == "" { // the default: byte-exact, no ID
		b = appendHex(b, fingerprintSum(req.Method, req.Path, req.RawQuery, req.ContentType, req.Body))
	} else {
		b = f.appendFingerprint(b, req.Method, req.Path, req.RawQuery, req.ContentType, req.Body)
	}
	n := len(b)
	b = append(b, e.tokenPrefix...)
	b = strconv.AppendUint(b, e.tokens.Add(1), 36)
	s := string(b)
	return s[:64], s[64:n], s[n:]
}

// readBody reads at most limit+1 bytes from r. hint is r's length + 1
// when known (0: unknown): a body of that length within the limit is read
// into one buffer of its size (into, when it has room), then r is checked
// for more (a declared length may be wrong outside a server), which is
// appended as it comes.
func readBody(r io.Reader, limit, hint int64, into []byte) ([]byte, error) {
	if hint <= 0 || hint-1 > limit {
		return io.ReadAll(io.LimitReader(r, limit+1))
	}
	b := into[:0]
	if int64(cap(into)) < hint-1 {
		b = make([]byte, hint-1)
	}
	b = b[:hint-1]
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	var one [1]byte
	n, err := io.ReadFull(r, one[:])
	switch {
	case n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)):
		return b, nil
	case n == 0:
		return nil, err
	}
	rest, err := io.ReadAll(io.LimitReader(r, limit-int64(len(b))))
	return append(append(b, one[0]), rest...), err
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// maxReleasers bounds the background releases under way, so that a long
// store outage under load cannot pile up goroutines; past it, keys wait for
// their leases to lapse.
const maxReleasers = 256

// releaseLater releases the lease token may hold on ev.Key, in the background:
// after a failed acquire (which may still land in a store that stalled) or a
// failed release. It tries at storeTimeout, then twice as late each time,
// until the store answers (released, or ErrNotOwner: no lease of token's is
// left, because the failed call never landed or did its work) or a lease
// (of the given duration) has passed, so a stalled store leaves no key stuck at 409 for a whole
// lease. Tokens are unique, so releasing a lease that never existed is
// harmless. A record with a step journal is left to lapse at once instead
// (lapseKeepingJournal). Close makes it try once at once, then stop.
func (e *Engine) releaseLater(ctx context.Context, ev Event, token string, lease time.Duration) {
	if e.local || e.releasers.Add(1) > maxReleasers {
		e.releasers.Add(-1)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		e.releasers.Add(-1)
		return
	}
	ctx = context.WithoutCancel(ctx)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer e.releasers.Add(-1)
		waited := time.Duration(0)
		for pause := e.cfg.storeTimeout; waited < lease; pause *= 2 {
			t := time.NewTimer(pause)
			last := false
			select {
			case <-e.closing:
				t.Stop()
				return
			case <-e.draining: // Close: one last try now, no more waiting
				t.Stop()
				last = true
			case <-t.C:
			}
			waited += pause
			start := time.Now()
			kept, err := e.lapseKeepingJournal(ctx, ev.Key, token)
			if !kept && err == nil {
				rctx, cancel := e.storeCall(ctx)
				err = e.store.Release(rctx, ev.Key, token)
				cancel()
			}
			switch {
			case kept:
				e.firstReport(abandonedName(token))
				e.emit(ctx, Event{Kind: EventAbandoned, Key: ev.Key, Method: ev.Method, Route: ev.Route})
			case err == nil:
				e.emit(ctx, Event{Kind: EventReleased, Key: ev.Key, Method: ev.Method, Route: ev.Route, Op: OpRelease, StoreDuration: time.Since(start)})
			}
			if kept || err == nil || errors.Is(err, ErrNotOwner) || last {
				return
			}
		}
	}()
}

// lapseKeepingJournal is releaseLater's first move with a [Journal] store
// that can shorten leases: a late acquire may have taken over a record
// whose steps are journaled, and a release would delete them (the retry
// would run a step that is not [Repeatable] again). It lets token's lease
// lapse at once, then reports kept when the record holds steps (left as
// abandon leaves it), or err (ErrNotOwner: token holds no lease). When
// neither, the caller releases: token's lease has lapsed, so a release
// that meets another holder's journal fails with ErrNotOwner.
func (e *Engine) lapseKeepingJournal(ctx context.Context, key, token string) (kept bool, err error) {
	if e.journal == nil || e.extender == nil {
		return false, nil
	}
	rctx, cancel := e.storeCall(ctx)
	err = e.extender.Extend(rctx, key, token, time.Millisecond)
	cancel()
	if err != nil {
		return false, err
	}
	return e.mayHaveSteps(ctx, key), nil
}

// mayHaveSteps reports whether key's record has a step journal, true when
// the store cannot tell.
func (e *Engine) mayHaveSteps(ctx context.Context, key string) bool {
	rctx, cancel := e.storeCall(ctx)
	defer cancel()
	steps, err := e.journal.Steps(rctx, key)
	return err != nil || len(steps) > 0
}

// Close stops the background completion retries (see [WithCompletionRetry])
// and the releases of leases a failed store call may have left. Pending
// releases are tried once at once; completion retries go on. Close waits
// only for that work, and returns nil as soon as none is left (at once
// when there was none), or abandons it when ctx is done, leaving its keys
// in progress until their leases lapse, and returns ctx.Err(). Call it
// after the server has shut down; Begin still works after Close, without
// background work. Lease renewals go on while executions run; their
// goroutine exits when none is left.
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.renewals.close()
	e.drainOnce.Do(func() { close(e.draining) })
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		e.closeOnce.Do(func() { close(e.closing) })
		<-done
		return ctx.Err()
	}
}

// storable is the default storage policy ([WithStorePolicy]).
func storable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

func (e *Engine) acquire(ctx context.Context, key, token, fp string, lease time.Duration) (Record, bool, error) {
	if e.local {
		if e.extender != nil {
			lease = localLease
		}
	} else {
		var cancel context.CancelFunc
		ctx, cancel = e.storeCall(ctx)
		defer cancel()
	}
	if e.keeper != nil {
		return e.keeper.AcquireKeep(ctx, key, token, fp, lease, e.cfg.keep)
	}
	return e.store.Acquire(ctx, key, token, fp, lease)
}
