package idem

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
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
}

// Engine decides, for each request, one of: pass through, reject, replay, or
// execute and record. It holds all policy; adapters only translate. An Engine
// is safe for concurrent use. Its only goroutines retry completions that
// failed on a store error; [Engine.Close] stops them.
type Engine struct {
	store    Store
	extender Extender
	tx       Transactional // nil unless the store offers transactional completion
	local    bool          // the store does no I/O: no timeout contexts
	cfg      config

	tokenPrefix string
	tokens      atomic.Uint64
	releasers   atomic.Int64 // background releases under way
	problems    problems

	unreadableMu sync.Mutex
	unreadable   map[string]struct{} // keys logged as unreadable

	mu        sync.Mutex // guards closed and wg.Add
	closed    bool
	wg        sync.WaitGroup // background completion retries and releases
	draining  chan struct{}  // closed by Close: background releases try now
	drainOnce sync.Once
	closing   chan struct{} // closed when Close's ctx is done: background work stops
	closeOnce sync.Once
}

// New returns an Engine backed by store. It returns an error when store is
// nil or an option is out of range (durations and limits must be > 0).
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
	e := &Engine{store: store, cfg: cfg, problems: newProblems(cfg.retryAfter, cfg.renderProblem), closing: make(chan struct{}), draining: make(chan struct{}), unreadable: map[string]struct{}{}, tokenPrefix: rand.Text() + "."}
	e.extender, _ = store.(Extender)
	e.tx, _ = store.(Transactional)
	if l, ok := store.(LocalStore); ok {
		e.local = l.Local()
	}
	return e, nil
}

// Header returns the canonical name of the idempotency key header.
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

// Begin decides what to do with req. It returns:
//   - nil, nil: pass through, run the handler unprotected (method not covered,
//     no key under [WithKeyOptional], or the store failed under [WithFailOpen]);
//   - nil, resp: do not run the handler; write resp, which is either a replay
//     (carrying "Idempotent-Replayed: true") or an RFC 9457 problem. resp is
//     read-only and may be shared; write it with [Response.Send] (net/http)
//     or [Response.WriteLines] (a framework's own header type), or read its
//     header lines with [Response.EachHeader] (a replay's Header may be nil);
//   - x, nil: run the handler, feed its body to x.Write, then call exactly
//     one of x.Finish, x.Fail (handler error without a response) or x.Abort
//     (panic).
//
// Answers: 400 missing or malformed key (or one the [WithKeyValidator]
// function refused), or unreadable body; 401 no principal;
// 413 body above the limit; 422 key reused with another fingerprint; 409
// request with this key in progress; 503 store unavailable; 500 the key's
// stored record is unreadable ([ErrCorrupt], even under [WithFailOpen]).
func (e *Engine) Begin(ctx context.Context, req *Request) (*Execution, *Response) {
	if !e.cfg.methods[req.Method] {
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
		req.Body, err = io.ReadAll(io.LimitReader(req.BodyReader, e.cfg.maxBodyBytes+1))
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
	scoped, fp, token := e.ids(req, route, key)
	ev := Event{Key: scoped, Method: req.Method, Route: req.Route} // the template only: a path may be unbounded
	var deadline time.Time
	if e.cfg.wait > 0 {
		deadline = time.Now().Add(e.cfg.wait)
	}
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		start := e.clock()
		rec, acquired, err := e.acquire(ctx, scoped, token, fp)
		now := e.clock()
		ev.Op, ev.StoreDuration = OpAcquire, now.Sub(start)
		switch {
		case errors.Is(err, ErrCorrupt):
			e.reportUnreadable(ctx, ev, err)
			return nil, e.problems.unreadable
		case err != nil:
			e.emitErr(ctx, ev, EventStoreError, err, "idem: acquire failed")
			e.releaseLater(ctx, ev, token) // the acquire may still land: don't leave a lease nobody owns
			if e.cfg.failOpen {
				e.cfg.logger.ErrorContext(ctx, "idem: store failed, running handler unprotected (fail-open)", "key", scoped[:16])
				return nil, nil
			}
			return nil, e.problems.unavailable
		case acquired:
			x := &Execution{e: e, token: token, fp: fp, ev: ev, started: now}
			x.detached.parent = ctx
			x.ctx = &x.detached
			e.emit(ctx, x.event(EventAcquired))
			x.startRenewal()
			return x, nil
		case rec.Fingerprint != fp:
			ev.Kind = EventMismatch
			e.emit(ctx, ev)
			return nil, e.problems.mismatch
		case rec.State == StateCompleted && rec.Encoded != nil:
			resp, err := sharedReplay(rec.Encoded)
			if err != nil {
				e.reportUnreadable(ctx, ev, fmt.Errorf("%w: %w", ErrCorrupt, err))
				return nil, e.problems.unreadable
			}
			ev.Kind = EventReplayed
			e.emit(ctx, ev)
			return nil, resp
		case rec.State == StateCompleted && rec.Response != nil:
			ev.Kind = EventReplayed
			e.emit(ctx, ev)
			resp := rec.Response
			if resp.Header == nil {
				resp.Header = make(http.Header, 1)
			}
			resp.Header[ReplayedHeader] = replayedValue[:1:1]
			return nil, resp
		}
		// In progress: wait for it when configured, else 409.
		if deadline.IsZero() || time.Now().Add(pause).After(deadline) || sleep(ctx, pause) != nil {
			ev.Kind = EventConflict
			e.emit(ctx, ev)
			return nil, e.problems.inProgress
		}
	}
}

// maxUnreadableLogged bounds the keys remembered as logged unreadable;
// past it the set starts again (a key may then be logged once more).
const maxUnreadableLogged = 1024

// reportUnreadable reports a key whose record the store cannot decode: an
// event every time, a log line (with the whole hashed key, which names the
// record to delete) once per key, so that clients retrying it don't flood
// the log.
func (e *Engine) reportUnreadable(ctx context.Context, ev Event, err error) {
	ev.Kind, ev.Err = EventStoreError, err
	e.unreadableMu.Lock()
	_, seen := e.unreadable[ev.Key]
	if !seen {
		if len(e.unreadable) >= maxUnreadableLogged {
			clear(e.unreadable)
		}
		e.unreadable[ev.Key] = struct{}{}
	}
	e.unreadableMu.Unlock()
	if !seen {
		e.cfg.logger.ErrorContext(ctx, "idem: stored record unreadable; answering 500 until it is deleted from the store (README: Clearing an unreadable record)",
			"key", ev.Key, "method", ev.Method, "route", ev.Route, "err", err)
	}
	e.emit(ctx, ev)
}

// ids returns the scoped key ([ScopedKey]), the fingerprint ([Fingerprint])
// and a new lease token for req, sliced from one string (one allocation).
// The token is one no other execution of any engine uses: a random
// per-engine prefix and a counter (tokens identify lease owners; they are
// never shown to clients, so they need to be unique, not secret).
func (e *Engine) ids(req *Request, route, key string) (scoped, fp, token string) {
	var stack [256]byte
	b := appendHex(stack[:0], scopedSum(req.Principal, req.Method, route, key))
	b = appendHex(b, fingerprintSum(req.Method, req.Path, req.RawQuery, req.ContentType, req.Body))
	b = append(b, e.tokenPrefix...)
	b = strconv.AppendUint(b, e.tokens.Add(1), 36)
	s := string(b)
	return s[:64], s[64:128], s[128:]
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

// Execution is one acquired request whose handler runs. Its methods are not
// safe for concurrent use, except that lease renewal runs on its own until
// Finish or Fail.
type Execution struct {
	e        *Engine
	ctx      context.Context // &detached: completion survives a client hang-up
	detached detached
	infoCtx  infoCtx // what WithInfo returns
	token    string
	ev       Event // template of x's events; ev.Key is the scoped key
	body     []byte

	started  time.Time     // when the lease was acquired
	handler  time.Duration // how long the handler ran, set by finishing
	storeDur time.Duration // how long the last Complete took
	info     Info          // what WithInfo puts in the handler's context
	unit     Unit          // the execution's transaction (Transactional stores), set by WithInfo
	fp       string
	header   http.Header // stored header lines, from SnapshotHeader or Finish
	outer    http.Header // header lines present when the execution began (OuterHeader)
	resp     Response    // what Finish stores, held here: no allocation
	wire     wire        // x.resp's header lines, after FinishLines

	unreplayable bool // the body can't be captured (see Unreplayable)

	renewFailed atomic.Bool // a failed renewal was logged

	mu       sync.Mutex
	timer    *time.Timer
	finished bool // Finish or Fail was called
	done     bool // renewal stopped
}

// Write captures response body bytes for storage. It keeps at most one byte
// over the stored-response limit and never fails; adapters call it with
// exactly the bytes sent to the client.
func (x *Execution) Write(p []byte) (int, error) {
	if room := x.e.cfg.maxResponseBytes + 1 - len(x.body); room > 0 {
		x.body = append(x.body, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

// OuterHeader tells x the response header lines present when the execution
// began: middleware outside idem set them for this exchange (CORS, request
// ids, rate limits), so they are not stored, and a replay carries what that
// middleware sets for the new exchange instead. A line the handler changed
// is stored with the handler's values. Adapters call it right after Begin,
// before the handler runs; h is copied.
func (x *Execution) OuterHeader(h http.Header) {
	if len(h) > 0 {
		x.outer = h.Clone()
	}
}

// SnapshotHeader records the response header as it is when the status is
// sent: later changes never reach the client, so they are not replayed
// either. Adapters call it once, when the header is written; Finish takes
// the header at its own call otherwise.
func (x *Execution) SnapshotHeader(h http.Header) {
	if x.header == nil {
		x.header = x.e.storedHeader(h, x.outer)
	}
}

// Unreplayable declares that the response body is not visible to the
// adapter (e.g. a body stream written after the middleware returns). Finish
// then records it like a body above the stored-response limit: retries get
// 410 "response-not-stored", never a second execution.
func (x *Execution) Unreplayable() { x.unreplayable = true }

// Finish records the handler's response: status (0 means 200) and header as
// sent, and the body given to Write. Responses with status 2xx, 3xx and 4xx
// other than 408, 409, 425 and 429 are stored (all of them with
// [WithStoreAll]); others release the key so that a retry executes again.
// Store errors are logged and reported as events; the client's response is
// never changed by them.
func (x *Execution) Finish(status int, header http.Header) {
	if status, ok := x.ending(status); ok {
		x.finishHeader(status, header, false)
	}
}

// ending marks the handler as done and applies the storage policy to its
// status (0 means 200): it reports false when the key was released instead.
func (x *Execution) ending(status int) (int, bool) {
	x.finishing() // the lease stays renewed while completion is tried
	if status == 0 {
		status = http.StatusOK
	}
	// A status outside 100-999 (RFC 9110 section 15) cannot be replayed:
	// release, whatever the storage policy says.
	if status < 100 || status > 999 || !x.e.cfg.storePolicy(status) {
		x.release()
		x.stopRenewal()
		return status, false
	}
	return status, true
}

// finishHeader stores header's lines worth replaying, filtering header in
// place when it is owned (built for this call and never used again).
func (x *Execution) finishHeader(status int, header http.Header, owned bool) {
	var location string                      // read before keepStored may delete it
	if v := header["Location"]; len(v) > 0 { // as header.Get: the name is canonical
		location = v[0]
	}
	if x.header == nil && owned {
		x.header = x.e.keepStored(header, x.outer)
	}
	if x.header == nil {
		x.header = x.e.storedHeader(header, x.outer)
	}
	x.resp = Response{Status: status, Header: x.header, Body: x.body}
	x.store(location)
}

// FinishLines is Finish for adapters of frameworks that keep the response
// in their own types (fasthttp: Fiber): lines (nil: none) holds the
// response header lines as sent, body the response body as sent (not
// retained). The stored lines and the body are encoded straight into the
// stored form ([Response.MarshalBinary]), with no http.Header in between.
// The body is given here, not through Write.
func (x *Execution) FinishLines(status int, lines *HeaderLines, body []byte) {
	status, ok := x.ending(status)
	if !ok {
		return
	}
	if lines == nil {
		lines = &noLines
	}
	if lines.more != nil { // unusual: many or long lines
		x.body = append(x.body[:0], body[:min(len(body), x.e.cfg.maxResponseBytes+1)]...)
		x.finishHeader(status, lines.more, true)
		return
	}
	if len(body) > x.e.cfg.maxResponseBytes {
		body = nil // not stored: response-not-stored
		x.unreplayable = true
	}
	x.resp = x.e.encodeLines(lines, status, body, x.outer, &x.wire)
	x.store(lines.location())
}

// store completes the record with x.resp, or with the response-not-stored
// problem when its body is not replayable.
func (x *Execution) store(location string) {
	status := x.resp.Status
	resp := &x.resp
	if x.unreplayable || len(x.resp.Body) > x.e.cfg.maxResponseBytes {
		resp = x.e.problems.notStored(status, location)
	}
	ev := x.event(EventCompleted)
	ev.Status = status
	err := x.complete(resp)
	if errors.Is(err, ErrTooLarge) {
		resp = x.e.problems.notStored(status, location)
		err = x.complete(resp)
	}
	if transient(err) { // a blip: try once more before the client gets its answer
		err = x.complete(resp)
	}
	if errors.Is(err, ErrNotOwner) && x.landed(resp) {
		err = nil // an attempt whose reply was lost or late did store it
	}
	if transient(err) && x.e.cfg.completionRetry > 0 && x.e.retryInBackground(x, resp, ev) {
		return
	}
	x.stopRenewal()
	x.reportCompletion(ev, err)
}

func (x *Execution) reportCompletion(ev Event, err error) {
	ev = x.ended(ev, OpComplete, x.storeDur)
	switch {
	case errors.Is(err, ErrNotOwner):
		x.e.emitErr(x.ctx, ev, EventLeaseLost, err, "idem: lease lost before completion; the response was not stored")
	case errors.Is(err, ErrNotDurable):
		x.e.emitErr(x.ctx, ev, EventCompleted, err, "idem: response stored, durability not confirmed")
	case err != nil:
		x.e.emitErr(x.ctx, ev, EventStoreError, err, "idem: complete failed; the key stays in progress until its lease lapses")
	default:
		x.e.emit(x.ctx, ev)
	}
}

// transient reports whether a Complete error may go away on a retry.
func transient(err error) bool {
	return err != nil && !errors.Is(err, ErrNotOwner) && !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrNotDurable)
}

func (x *Execution) complete(resp *Response) error {
	start := x.e.clock()
	var err error
	if x.e.local {
		err = x.storeComplete(x.ctx, resp)
	} else {
		ctx, cancel := context.WithTimeout(x.ctx, x.e.cfg.storeTimeout)
		err = x.storeComplete(ctx, resp)
		cancel()
	}
	x.storeDur = x.e.clock().Sub(start)
	return err
}

// storeComplete completes through x's Unit when it has one, else the Store.
func (x *Execution) storeComplete(ctx context.Context, resp *Response) error {
	if x.unit != nil {
		return x.unit.Complete(ctx, resp, x.e.cfg.retention)
	}
	return x.e.store.Complete(ctx, x.ev.Key, x.token, resp, x.e.cfg.retention)
}

// retryInBackground keeps renewing the lease and retries Complete with
// backoff for up to the completion-retry window, so that a store blip after
// the handler ran does not let a retry execute it again. It reports false
// when the engine is closed.
func (e *Engine) retryInBackground(x *Execution, resp *Response, ev Event) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer x.stopRenewal()
		deadline := time.Now().Add(e.cfg.completionRetry)
		err := errors.New("idem: completion retry window ended")
		for pause := 50 * time.Millisecond; time.Now().Add(pause).Before(deadline); pause = min(2*pause, 2*time.Second) {
			t := time.NewTimer(pause)
			select {
			case <-e.closing:
				t.Stop()
				x.reportCompletion(ev, errors.New("idem: engine closed before the completion was stored"))
				return
			case <-t.C:
			}
			if err = x.complete(resp); errors.Is(err, ErrNotOwner) && x.landed(resp) {
				err = nil // an earlier attempt that timed out reached the store after all
			}
			if !transient(err) {
				break
			}
		}
		x.reportCompletion(ev, err)
	}()
	return true
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
// has passed, so a stalled store leaves no key stuck at 409 for a whole
// lease. Tokens are unique, so releasing a lease that never existed is
// harmless. Close makes it try once at once, then stop.
func (e *Engine) releaseLater(ctx context.Context, ev Event, token string) {
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
		for pause := e.cfg.storeTimeout; waited < e.cfg.lease; pause *= 2 {
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
			rctx, cancel := context.WithTimeout(ctx, e.cfg.storeTimeout)
			err := e.store.Release(rctx, ev.Key, token)
			cancel()
			if err == nil {
				e.emit(ctx, Event{Kind: EventReleased, Key: ev.Key, Method: ev.Method, Route: ev.Route, Op: OpRelease, StoreDuration: time.Since(start)})
			}
			if err == nil || errors.Is(err, ErrNotOwner) || last {
				return
			}
		}
	}()
}

// landed reports whether the key holds this execution's completed record,
// resp: after [ErrNotOwner] from Complete, an earlier attempt whose reply
// was lost (connection cut, reply later than the store timeout, or a
// client-side retry of a command that had run) may have stored it. Stores
// that drop the token on completion are matched by fingerprint and
// response, so that a takeover's completion is not taken for this one.
func (x *Execution) landed(resp *Response) bool {
	ctx, cancel := context.WithTimeout(x.ctx, x.e.cfg.storeTimeout)
	defer cancel()
	rec, found, err := x.e.store.Get(ctx, x.ev.Key)
	if err != nil || !found || rec.State != StateCompleted || rec.Fingerprint != x.fp || rec.Response == nil {
		return false
	}
	if rec.Token != "" {
		return rec.Token == x.token
	}
	return rec.Response.Status == resp.Status && bytes.Equal(rec.Response.Body, resp.Body)
}

// Close stops the background completion retries (see [WithCompletionRetry])
// and the releases of leases a failed store call may have left. Pending
// releases are tried once at once; completion retries go on. Close waits
// only for that work, and returns nil as soon as none is left (at once
// when there was none), or abandons it when ctx is done, leaving its keys
// in progress until their leases lapse, and returns ctx.Err(). Call it
// after the server has shut down; Begin still works after Close, without
// background work.
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
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

// Abort ends an execution whose handler panicked; adapters re-raise the
// panic after it. status is the final status already sent to the client, or
// 0. When nothing was sent the key is released, like Fail. When a status was
// sent, the handler's work may be done (a panic in post-processing, after
// the charge), so the record is completed as executed but not replayable:
// retries get 410 "response-not-stored", never a second execution (a 5xx
// status is still released, by the status policy).
func (x *Execution) Abort(status int, header http.Header) {
	if status == 0 {
		x.Fail()
		return
	}
	x.Unreplayable()
	x.Finish(status, header)
}

// Fail releases the key after a handler error without a response, so that
// a retry executes again.
func (x *Execution) Fail() {
	x.finishing()
	x.release()
	x.stopRenewal()
}

// bodyAllowed reports whether a response with status may carry a body and
// Content-Length (RFC 9110 sections 6.4.1 and 8.6).
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// storable is the default storage policy ([WithStorePolicy]).
func storable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

func (e *Engine) acquire(ctx context.Context, key, token, fp string) (Record, bool, error) {
	lease := e.cfg.lease
	if e.local {
		if e.extender != nil {
			lease = localLease
		}
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.cfg.storeTimeout)
		defer cancel()
	}
	return e.store.Acquire(ctx, key, token, fp, lease)
}

func (x *Execution) release() {
	start := x.e.clock()
	ctx, cancel := context.WithTimeout(x.ctx, x.e.cfg.storeTimeout)
	var err error
	if x.unit != nil {
		err = x.unit.Release(ctx)
	} else {
		err = x.e.store.Release(ctx, x.ev.Key, x.token)
	}
	cancel()
	ev := x.ended(x.ev, OpRelease, x.e.clock().Sub(start))
	switch {
	case errors.Is(err, ErrNotOwner):
		x.e.emitErr(x.ctx, ev, EventLeaseLost, err, "idem: lease lost before release")
	case err != nil:
		x.e.emitErr(x.ctx, ev, EventStoreError, err, "idem: release failed; retrying in the background")
		x.e.releaseLater(x.ctx, x.ev, x.token)
	default:
		ev.Kind = EventReleased
		x.e.emit(x.ctx, ev)
	}
}

// localLease is the lease taken in a [LocalStore] that can renew leases:
// such a store lives and dies with the process, so a lease there never
// needs to lapse to free the key of a crashed holder; it is held until
// Finish, Fail or Abort, exactly as renewal would keep it, without a
// renewal timer per execution. About 146 years: now plus it never overflows.
const localLease = time.Duration(1 << 62)

func (x *Execution) startRenewal() {
	if x.e.extender != nil && !x.e.local {
		x.mu.Lock()
		x.timer = time.AfterFunc(x.e.cfg.lease/3, x.renew)
		x.mu.Unlock()
	}
}

func (x *Execution) renew() {
	start := time.Now()
	every := x.e.cfg.lease / 3
	ctx, cancel := context.WithTimeout(x.ctx, min(x.e.cfg.storeTimeout, every)) // a slow renewal must not outlast the lease
	err := x.e.extender.Extend(ctx, x.ev.Key, x.token, x.e.cfg.lease)
	cancel()
	ev := x.ev
	ev.Op, ev.StoreDuration = OpExtend, time.Since(start)
	if errors.Is(err, ErrNotOwner) {
		x.mu.Lock()
		finished := x.finished
		x.mu.Unlock()
		if !finished { // after Finish or Fail, the record is legitimately no longer ours
			x.e.emitErr(x.ctx, ev, EventLeaseLost, err, "idem: lease lost while the handler runs")
		}
		return
	}
	if err != nil {
		if x.renewFailed.Swap(true) { // logged once per execution; every failure is an event
			ev.Kind, ev.Err = EventStoreError, err
			x.e.emit(x.ctx, ev)
		} else {
			x.e.emitErr(x.ctx, ev, EventStoreError, err, "idem: lease renewal failed; retrying (further failures of this execution are reported as events only)")
		}
	}
	x.mu.Lock()
	if !x.done {
		x.timer.Reset(max(0, every-time.Since(start))) // fixed rate from the previous start
	}
	x.mu.Unlock()
}

// finishing marks the handler as done and measures how long it ran;
// renewal continues until stopRenewal.
func (x *Execution) finishing() {
	x.handler = x.e.clock().Sub(x.started)
	x.mu.Lock()
	x.finished = true
	x.mu.Unlock()
}

// detached is context.WithoutCancel(parent) held in the Execution, saving
// an allocation: values of parent, never its deadline or cancellation.
type detached struct{ parent context.Context }

func (*detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detached) Done() <-chan struct{}       { return nil }
func (*detached) Err() error                  { return nil }
func (d *detached) Value(key any) any         { return d.parent.Value(key) }

func (x *Execution) stopRenewal() {
	if x.timer == nil {
		return
	}
	x.mu.Lock()
	x.done = true
	x.timer.Stop()
	x.mu.Unlock()
}

func (x *Execution) event(k EventKind) Event {
	ev := x.ev
	ev.Kind = k
	return ev
}

// ended returns ev as the event ending the execution: the store call op
// that took d, and the handler's duration.
func (x *Execution) ended(ev Event, op StoreOp, d time.Duration) Event {
	ev.Op, ev.StoreDuration, ev.HandlerDuration, ev.Ended = op, d, x.handler, true
	return ev
}

// storedHeader returns the header lines worth replaying: those the handler
// set (lines of outer it left unchanged belong to the outer exchange), minus
// the unstored names, and only allowlisted ones under [WithStoredHeaders].
// The value slices are shared with h: the store copies what it keeps.
func (e *Engine) storedHeader(h, outer http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		if e.stores(k, v, outer) {
			out[k] = v
		}
	}
	return out
}

// keepStored is storedHeader deleting from h in place; it returns h, or
// an empty header when h is nil.
func (e *Engine) keepStored(h, outer http.Header) http.Header {
	if h == nil {
		return http.Header{}
	}
	for k, v := range h {
		if !e.stores(k, v, outer) {
			delete(h, k)
		}
	}
	return h
}

// stores reports whether the header line k: v is worth replaying (see storedHeader).
func (e *Engine) stores(k string, v []string, outer http.Header) bool {
	return len(v) > 0 && e.storesName(k) && !(slices.Equal(outer[k], v) && outer[k] != nil)
}

// storesName reports whether lines named k may be stored at all: not
// unstored ([WithUnstoredHeaders]) and allowlisted ([WithStoredHeaders]).
func (e *Engine) storesName(k string) bool {
	return !e.cfg.unstored[k] && (e.cfg.stored == nil || e.cfg.stored[k])
}

// IsReplay reports whether resp is a stored response being replayed (it
// carries "Idempotent-Replayed: true"), as opposed to a problem the engine
// answered with.
func (resp *Response) IsReplay() bool {
	if resp.wire != nil && resp.Header == nil {
		return resp.wire.replayed
	}
	v := resp.Header[ReplayedHeader] // canonical: no Get, which canonicalises
	return len(v) > 0 && v[0] == "true"
}

// replayedValue is the value slice of the ReplayedHeader line of every
// replay (shared: capacity 1, so an append copies).
var replayedValue = []string{"true"}

// Send writes resp to w: header lines (replacing any of the same name), status
// and body. Adapters on net/http based frameworks use it for Begin's answers.
func (resp *Response) Send(w http.ResponseWriter) {
	h := w.Header()
	if resp.wire != nil && resp.Header == nil {
		maps.Copy(h, resp.header()) // a new map: its value slices are h's to keep
	} else {
		for k, v := range resp.Header {
			h[k] = append([]string(nil), v...)
		}
	}
	if bodyAllowed(resp.Status) {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body)
	}
}
