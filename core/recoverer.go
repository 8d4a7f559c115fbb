package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Defaults of the [Recoverer]'s options.
const (
	DefaultRecoverInterval    = 5 * time.Second
	DefaultRecoverAttempts    = 5
	DefaultRecoverBackoff     = time.Second
	DefaultRecoverMaxBackoff  = 5 * time.Minute
	DefaultRecoverBatch       = 64
	DefaultRecoverConcurrency = 4
)

// Runner runs a request the [Recoverer] rebuilt through the service's own
// handler chain (authentication, the idem adapter, the handler) and
// returns the status it answered. [HTTPRunner] runs an http.Handler
// (net/http, chi, Gin, Echo); idemfiber.Runner and idemfiberv3.Runner run
// a Fiber app. It must not return before the handler chain has.
type Runner func(req *http.Request) (status int, err error)

// HTTPRunner returns a [Runner] serving requests with h, the service's
// whole handler chain (e.g. the *gin.Engine, the *echo.Echo, the mux with
// its middleware), in the calling goroutine; the response is discarded
// (the engine stores it for the client's retry). A panic in h is returned
// as an error.
func HTTPRunner(h http.Handler) Runner {
	return func(req *http.Request) (status int, err error) {
		w := &discardWriter{h: http.Header{}}
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("idem: the recovery run panicked: %v", p)
			}
		}()
		h.ServeHTTP(w, req)
		if w.status == 0 {
			w.status = http.StatusOK
		}
		return w.status, nil
	}
}

// discardWriter is the response writer of [HTTPRunner]: it keeps the
// status only.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header { return w.h }

func (w *discardWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
}

func (w *discardWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(p), nil
}

func (w *discardWriter) Flush() {}

// RecovererOption configures a [Recoverer].
type RecovererOption func(*Recoverer)

// RecoverEvery sets how long [Recoverer.Run] waits between passes
// (±25% jitter, so that the recoverers of several instances spread),
// and bounds how long one pass goes on asking for more due records: a
// pass that reached that bound with due records left is followed at once
// by another. Optional. Default is 5s.
func RecoverEvery(d time.Duration) RecovererOption { return func(r *Recoverer) { r.interval = d } }

// RecoverAttempts sets how many recovery runs a record gets: the claim
// after the last parks it ([Journal.Suspend]: uncertain, an
// [EventRecoveryParked] and a warning), for an operator to resolve
// (idemctl list -state uncertain). Client takeovers do not count.
// Optional. Default is 5.
func RecoverAttempts(n int) RecovererOption { return func(r *Recoverer) { r.attempts = n } }

// RecoverBackoff sets the delay, after a recovery run's lease lapses,
// before the record is due again: base after the first attempt, doubling
// with each, at most maxDelay. Optional. Default is 1s, at most 5m.
func RecoverBackoff(base, maxDelay time.Duration) RecovererOption {
	return func(r *Recoverer) { r.backoff, r.maxBackoff = base, maxDelay }
}

// RecoverRequests sets the [Runner] that runs recovered HTTP requests
// through the service's handler chain, e.g. HTTPRunner(router). Required
// for recoverable routes ([RouteRecovery]); without it their records are
// deferred with an error log, and parked after the attempts.
func RecoverRequests(run Runner) RecovererOption { return func(r *Recoverer) { r.run = run } }

// RecoverBatch sets how many due records one pass claims at most
// ([Recoverable.Lapsed]'s limit). Optional. Default is 64.
func RecoverBatch(n int) RecovererOption { return func(r *Recoverer) { r.batch = n } }

// RecoverConcurrency sets how many recovery runs a pass runs at once.
// Optional. Default is 4.
func RecoverConcurrency(n int) RecovererOption { return func(r *Recoverer) { r.concurrency = n } }

// Recoverer finishes executions whose holder stopped (crashed, or stalled
// past its lease) when no client comes back: recoverable routes
// ([RouteRecovery], [WithRecovery]) and [Do] operations
// ([Operation.Recover]). Each pass asks the store for due records
// ([Recoverable.Lapsed]), takes each over with a fresh token
// ([Recoverable.Claim]: fenced exactly as a client retry's takeover, with
// an [EventRecoveryStarted] and an [EventTakeover]), and runs it again:
// an HTTP request rebuilt from its payload through the service's own
// handler chain ([RecoverRequests]), carrying [RecoveryHeader] so that
// the authentication re-establishes the stored principal
// ([Engine.RecoveryPrincipal]) and the engine adopts the claim; an
// operation through the function registered for its name ([Recoverer.Handle]).
// Finished steps replay, [Repeatable] ones run again with their derived
// keys, and the answer is stored for the client's eventual retry, which
// gets a replay ([EventRecovered]). A run that ends without an answer to
// store leaves the record due again after a backoff; after the last
// attempt it is parked uncertain.
//
// Run one in every instance (the store's Claim is the fence: several
// recoverers never run one record at a time, and a client retry during a
// run gets 409 in-progress), or in a process of its own built with the
// same handler chain and engine options. Stores must implement
// [Recoverable] and [Journal].
type Recoverer struct {
	e                             *Engine
	interval, backoff, maxBackoff time.Duration
	attempts, batch, concurrency  int
	run                           Runner
	ops                           map[string]func(ctx context.Context, op Operation) error
	opsMu                         sync.RWMutex

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}

	failedMu sync.Mutex
	failed   map[string]int // scoped key → claims of the due record that failed in a row, pass after pass
}

// claimWarnAfter is how many claims of one due record must fail in a row
// (pass after pass: a store error, or Claim finding it not due while
// Lapsed keeps returning it) before the [Recoverer] logs a warning; it
// warns again every claimWarnAfter more.
const claimWarnAfter = 3

// NewRecoverer returns a Recoverer of e's records. It does no I/O. It
// returns an error when e's store does not implement [Recoverable] and
// [Journal], e uses [WithUncertainAfterCrash], or an option is out of
// range (durations and counts > 0, max backoff >= base).
func NewRecoverer(e *Engine, opts ...RecovererOption) (*Recoverer, error) {
	r := &Recoverer{e: e, interval: DefaultRecoverInterval, attempts: DefaultRecoverAttempts, backoff: DefaultRecoverBackoff,
		maxBackoff: DefaultRecoverMaxBackoff, batch: DefaultRecoverBatch, concurrency: DefaultRecoverConcurrency,
		ops: map[string]func(context.Context, Operation) error{}}
	for _, o := range opts {
		o(r)
	}
	switch {
	case e.recoverable == nil || e.journal == nil:
		return nil, fmt.Errorf("idem: a Recoverer needs a store that implements idem.Recoverable and idem.Journal; %T does not", e.store)
	case e.cfg.keep.Uncertain > 0:
		return nil, errors.New("idem: a Recoverer cannot recover under WithUncertainAfterCrash: lapsed records turn uncertain")
	case r.interval <= 0 || r.backoff <= 0 || r.maxBackoff < r.backoff || r.attempts <= 0 || r.batch <= 0 || r.concurrency <= 0:
		return nil, errors.New("idem: Recoverer options: interval, backoff, attempts, batch and concurrency must be > 0, max backoff >= backoff")
	}
	return r, nil
}

// Handle registers fn as the recovery of the [Do] operations named name
// ([Operation.Recover]): a recovery run calls fn with the operation as
// it was given to Do (Scope, Name, Key, Payload, Input; no Codec), and fn calls
// Do again with it (setting its Codec) and the operation's function; Do
// adopts the run's claim through ctx instead of acquiring. fn's error
// other than Do's own ends the run as deferred. A later Handle of the
// same name replaces fn.
func (r *Recoverer) Handle(name string, fn func(ctx context.Context, op Operation) error) {
	r.opsMu.Lock()
	r.ops[name] = fn
	r.opsMu.Unlock()
}

// RecoveryReport counts what one [Recoverer.RecoverOnce] pass did.
type RecoveryReport struct {
	Due       int // due records seen: those Lapsed returned, each counted once per pass
	Claimed   int // records this pass took over
	Recovered int // runs that stored the answer
	Deferred  int // runs that ended without an answer to store (due again after the backoff)
	Uncertain int // runs that ended uncertain (a step's outcome unknown) or were parked
	Parked    int // records parked uncertain, their attempts exhausted or their payload unreadable (counted in Uncertain too)
	// OldestDue is how long the longest-due record this pass claimed had
	// been due (since its lease lapsed, plus its backoff after an earlier
	// attempt), by the store's clock ([RecoveryClaim.Lapsed]); 0 when the
	// pass claimed none. A recoverer that keeps up keeps it near
	// RecoverEvery.
	OldestDue time.Duration
}

// Start runs [Recoverer.Run] in a goroutine until Stop. Calling it again
// before Stop does nothing.
func (r *Recoverer) Start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		_ = r.Run(ctx)
	}(r.done)
}

// Stop stops what Start started and waits for it: runs under way see
// their context cancelled; what they leave is due again after its
// backoff.
func (r *Recoverer) Stop() {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.cancel, r.done = nil, nil
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Run runs passes ([Recoverer.RecoverOnce]) every interval until ctx is
// done, then returns nil. Errors of a pass are logged.
func (r *Recoverer) Run(ctx context.Context) error {
	t := time.NewTimer(r.jitter())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		_, more, err := r.pass(ctx)
		if err != nil && ctx.Err() == nil {
			r.e.cfg.logger.ErrorContext(ctx, "idem: recovery pass failed", "err", err)
		}
		next := r.jitter()
		if err == nil && more {
			next = 0 // the pass ended on its time bound with due records left
		}
		t.Reset(next)
	}
}

func (r *Recoverer) jitter() time.Duration {
	return r.interval*3/4 + rand.N(r.interval/2+1) //nolint:gosec // jitter, not a secret
}

// RecoverOnce runs one pass: it asks the store for up to the batch of due
// records, claims each and runs it (at most the concurrency at once), and,
// while the store answered a full batch, asks again for the records due
// now that the pass has not seen, until it has seen every record due now
// or the pass has lasted [RecoverEvery]'s interval. It returns when every
// run it started has ended, having reported what it did as an
// [EventRecoveryPass]. err reports a failed Lapsed only; each record's
// failures are logged and reported as events, and a record whose claims
// keep failing pass after pass is logged as a warning.
func (r *Recoverer) RecoverOnce(ctx context.Context) (RecoveryReport, error) {
	rep, _, err := r.pass(ctx)
	return rep, err
}

// pass is RecoverOnce; more reports that it ended on its time bound with
// a full batch last: more records may be due.
func (r *Recoverer) pass(ctx context.Context) (rep RecoveryReport, more bool, err error) {
	e := r.e
	began := time.Now()
	seen := map[string]bool{}
	failed := map[string]bool{}
	var mu sync.Mutex
	defer func() {
		if err == nil || len(seen) > 0 { // a pass whose first Lapsed failed saw nothing: the counts stand
			r.noteFailures(ctx, seen, failed)
		}
		e.emit(ctx, Event{Kind: EventRecoveryPass, Pass: &rep})
	}()
	for {
		start := e.clock()
		c, cancel := e.storeCall(ctx)
		due, lerr := e.recoverable.Lapsed(c, r.batch)
		cancel()
		if lerr != nil {
			e.emit(ctx, Event{Kind: EventStoreError, Op: OpLapsed, StoreDuration: e.clock().Sub(start), Err: lerr})
			return rep, false, lerr
		}
		fresh := due[:0:0]
		for _, d := range due {
			if !seen[d.Key] {
				seen[d.Key] = true
				fresh = append(fresh, d)
			}
		}
		rep.Due += len(fresh)
		var wg sync.WaitGroup
		sem := make(chan struct{}, r.concurrency)
		for _, d := range fresh {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				wg.Wait()
				return rep, false, nil
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				o, dueFor := r.recoverOne(ctx, d)
				mu.Lock()
				defer mu.Unlock()
				if o != outcomeNotClaimed {
					rep.Claimed++
					rep.OldestDue = max(rep.OldestDue, dueFor)
				}
				switch o {
				case outcomeNotClaimed:
					failed[d.Key] = true
				case outcomeRecovered:
					rep.Recovered++
				case outcomeDeferred:
					rep.Deferred++
				case outcomeParked:
					rep.Parked++
					rep.Uncertain++
				case outcomeUncertain:
					rep.Uncertain++
				}
			}()
		}
		wg.Wait()
		switch {
		case len(due) < r.batch || len(fresh) == 0 || ctx.Err() != nil:
			return rep, false, nil // every record due now seen (or only seen ones came back)
		case time.Since(began) >= r.interval:
			return rep, true, nil
		}
	}
}

// noteFailures counts, for each due record of a pass (seen), whether its
// claim failed, and warns of those whose claims failed claimWarnAfter
// passes in a row (and every claimWarnAfter more). Records not seen again
// are forgotten: the map stays as large as one pass.
func (r *Recoverer) noteFailures(ctx context.Context, seen, failed map[string]bool) {
	r.failedMu.Lock()
	defer r.failedMu.Unlock()
	next := make(map[string]int, len(failed))
	for key := range seen {
		if !failed[key] {
			continue
		}
		n := r.failed[key] + 1
		next[key] = n
		if n%claimWarnAfter == 0 {
			short := key
			if len(short) > 16 {
				short = short[:16]
			}
			r.e.cfg.logger.WarnContext(ctx, "idem: a record due for recovery could not be claimed pass after pass (store errors, or the store's Lapsed and Claim disagree on whether it is due); it is not recovered",
				"key", short, "failed_claims", n)
		}
	}
	r.failed = next
}

type recoveryOutcome int

const (
	outcomeNotClaimed recoveryOutcome = iota
	outcomeRecovered
	outcomeDeferred
	outcomeUncertain
	outcomeParked
)

// backoffAfter returns the backoff the claim of the given attempt (1 for
// the first) gives: base, doubling with each attempt, at most maxBackoff.
func (r *Recoverer) backoffAfter(attempt int) time.Duration {
	backoff := r.backoff
	for i := 1; i < attempt && backoff < r.maxBackoff; i++ {
		backoff *= 2
	}
	return min(backoff, r.maxBackoff)
}

// recoverOne claims the due record d and runs it. dueFor is how long it
// had been due when claimed (0 when not claimed).
func (r *Recoverer) recoverOne(ctx context.Context, d LapsedRecord) (o recoveryOutcome, dueFor time.Duration) {
	e := r.e
	token := e.tokenPrefix + strconv.FormatUint(e.tokens.Add(1), 36)
	backoff := r.backoffAfter(d.Attempts + 1)
	ev := Event{Key: d.Key}
	start := e.clock()
	c, cancel := e.storeCall(ctx)
	claim, claimed, err := e.recoverable.Claim(c, d.Key, token, e.maxLease, backoff)
	cancel()
	ev.Op, ev.StoreDuration = OpClaim, e.clock().Sub(start)
	switch {
	case err != nil:
		e.emitErr(ctx, ev, EventStoreError, err, "idem: recovery claim failed")
		return outcomeNotClaimed, 0
	case !claimed: // not due any more: completed, taken over, claimed by another recoverer
		return outcomeNotClaimed, 0
	}
	dueFor = claim.Lapsed
	if claim.Attempts > 1 {
		dueFor -= r.backoffAfter(claim.Attempts - 1)
	}
	dueFor = max(dueFor, 0)
	req, derr := decodeRecovery(claim.Payload)
	pol := &e.cfg.policy
	if derr == nil {
		if req.Kind == recoveryHTTP {
			ev.Method, ev.Route = req.Method, req.Route
			pol = e.route(req.Method, req.Route)
		} else {
			ev.Method, ev.Route = doMethod, req.Route
		}
	}
	started := ev
	started.Kind = EventRecoveryStarted
	e.emit(ctx, started)
	e.reportTakeover(ctx, ev, Record{Token: claim.PreviousToken, LeaseLeft: -claim.Lapsed})
	switch {
	case derr != nil:
		e.cfg.logger.ErrorContext(ctx, "idem: recovery payload unreadable; parking the record", "key", d.Key, "err", derr)
		return r.park(ctx, ev, pol, token, claim.Attempts), dueFor
	case claim.Attempts > r.attempts:
		return r.park(ctx, ev, pol, token, claim.Attempts), dueFor
	}
	pc := &pendingClaim{key: d.Key, token: token, fp: claim.Fingerprint, principal: req.Principal,
		method: ev.Method, route: ev.Route, attempts: claim.Attempts, adopted: make(chan *Execution, 1)}
	status, runErr := r.runClaim(ctx, req, pc)
	var x *Execution
	select {
	case x = <-pc.adopted:
	default:
	}
	if x == nil {
		e.cfg.logger.WarnContext(ctx, "idem: a recovery run did not reach the engine (refused on its way, e.g. by authentication not calling Engine.RecoveryPrincipal, or no runner or function for it); the record is due again after its backoff",
			"key", d.Key, "method", ev.Method, "route", ev.Route, "attempt", claim.Attempts, "status", status, "err", runErr)
		if e.extender != nil && !e.local {
			c, cancel := e.storeCall(ctx)
			_ = e.extender.Extend(c, d.Key, token, time.Millisecond)
			cancel()
		}
		deferred := ev
		deferred.Kind, deferred.Err = EventRecoveryDeferred, runErr
		e.emit(ctx, deferred)
		return outcomeDeferred, dueFor
	}
	var end error
	select {
	case end = <-x.recovered:
	case <-ctx.Done():
		return outcomeDeferred, dueFor
	}
	switch {
	case end == nil:
		done := ev
		done.Kind, done.Status = EventRecovered, status
		e.emit(ctx, done)
		return outcomeRecovered, dueFor
	case errors.Is(end, ErrUncertain):
		return outcomeUncertain, dueFor
	case errors.Is(end, errRecoveryDeferred):
		e.cfg.logger.WarnContext(ctx, "idem: a recovery run ended without an answer to store; the record is due again after its backoff",
			"key", d.Key, "method", ev.Method, "route", ev.Route, "attempt", claim.Attempts, "status", status, "err", runErr)
		return outcomeDeferred, dueFor
	}
	return outcomeDeferred, dueFor // lease lost or store error: reported by the execution
}

// runClaim runs the claimed record's request or operation, returning the
// HTTP status (200 for an operation that returned nil) and the run's error.
func (r *Recoverer) runClaim(ctx context.Context, req *recoveryRequest, pc *pendingClaim) (status int, err error) {
	if req.Kind == recoveryOp {
		r.opsMu.RLock()
		fn := r.ops[req.Route]
		r.opsMu.RUnlock()
		if fn == nil {
			return 0, fmt.Errorf("idem: no recovery function for operation %q (Recoverer.Handle)", req.Route)
		}
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("idem: the recovery of operation %q panicked: %v", req.Route, p)
			}
		}()
		op := Operation{Scope: req.Method, Name: req.Route, Key: req.Key, Payload: req.Body, Input: []byte(req.Path)}
		if err := fn(context.WithValue(ctx, recoveryCtxKey{}, pc), op); err != nil {
			return 0, err
		}
		return http.StatusOK, nil
	}
	if r.run == nil {
		return 0, errors.New("idem: no Runner for recovered requests (RecoverRequests)")
	}
	nonce := r.e.pending.add(pc)
	defer r.e.pending.take(nonce)
	u := &url.URL{Path: req.Path, RawQuery: req.RawQuery}
	hreq, err := http.NewRequestWithContext(ctx, req.Method, u.String(), bytes.NewReader(req.Body))
	if err != nil {
		return 0, err
	}
	for k, v := range req.Header {
		hreq.Header[k] = v
	}
	if req.CType != "" {
		hreq.Header.Set("Content-Type", req.CType)
	}
	hreq.Header.Set(r.e.cfg.header, sfString(req.Key))
	hreq.Header.Set(RecoveryHeader, nonce)
	hreq.RequestURI = u.RequestURI()
	return r.run(hreq)
}

// park suspends the claimed record (uncertain), its attempts exhausted:
// outcomeParked, or outcomeDeferred when the store failed (it is due
// again).
func (r *Recoverer) park(ctx context.Context, ev Event, pol *routePolicy, token string, attempts int) recoveryOutcome {
	e := r.e
	start := e.clock()
	c, cancel := e.storeCall(ctx)
	err := e.journal.Suspend(c, ev.Key, token, pol.retention)
	cancel()
	ev.Op, ev.StoreDuration = OpSuspend, e.clock().Sub(start)
	if err != nil {
		e.emitErr(ctx, ev, EventStoreError, err, "idem: parking a record whose recovery attempts are exhausted failed; it is due again")
		return outcomeDeferred
	}
	e.firstReport(suspendedName(token)) // a takeover from it follows an operator's resolve (reportTakeover)
	e.cfg.logger.WarnContext(ctx, "idem: recovery attempts exhausted; the record is parked uncertain until an operator resolves it (idemctl list -state uncertain; README: Recovery without a client)",
		"key", ev.Key, "method", ev.Method, "route", ev.Route, "attempts", attempts-1)
	ev.Kind = EventRecoveryParked
	e.emit(ctx, ev)
	return outcomeParked
}
