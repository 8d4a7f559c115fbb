package idem

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Execution is one acquired request whose handler runs, from [Engine.Begin]
// to exactly one of Finish, FinishLines, Fail or Abort. Its methods are not
// safe for concurrent use. Meanwhile the engine renews its lease on its own
// (stores that implement [Extender]), until the completion or release is
// done, or given up; an Execution is not reused afterwards.
type Execution struct {
	e        *Engine
	pol      *routePolicy    // the route's lease, retention and fingerprint function
	ctx      context.Context // &detached: completion survives a client hang-up
	detached detached
	infoCtx  infoCtx // what WithInfo returns
	token    string
	ev       Event  // template of x's events; ev.Key is the scoped key
	body     []byte // the body given to Write, until SnapshotHeader (then it goes to enc)

	started  time.Time     // when the lease was acquired
	handler  time.Duration // how long the handler ran, set by finishing
	storeDur time.Duration // how long the last Complete took
	info     Info          // what WithInfo puts in the handler's context
	unit     Unit          // the execution's transaction (Transactional stores), set by WithInfo
	fp       string
	outer    http.Header // header lines present when the execution began (OuterHeader)

	// After SnapshotHeader, enc holds the encoded stored header lines and
	// then the body from Write, which starts at bodyAt; Finish ends it.
	// Finish and FinishLines encode into enc too when nothing was
	// snapshotted. Its buffer is recycled when the execution ends.
	enc    encoder
	bodyAt int     // 0: no snapshot
	buf    *encBuf // the recycled buffer x took for enc (see recycle), or nil

	unreplayable bool // the body can't be captured (see Unreplayable)

	reported func(err error) // Do and recoveries: told how the completion ended (nil: stored)

	recovering bool           // a Recoverer's run: an answer not stored leaves the record to lapse, not released
	tookOver   bool           // the lease was taken over from a holder that stopped (or claimed by a Recoverer)
	recovered  chan error     // a Recoverer's run: told how the execution ended (nil: stored), capacity 1
	cw         *CaptureWriter // the writer Capture or NewCaptureWriter made, nil for other adapters

	renewFailed atomic.Bool // a failed renewal was logged

	due  time.Duration // next renewal (renewClock), under the engine's renewals.mu
	slot int           // index in the renewals heap, -1 out of it; under renewals.mu

	renewing    bool                // startRenewal registered x with the engine's renewals
	finished    bool                // Finish or Fail was called; under mu
	steps       map[string]struct{} // steps running (Step); under mu
	suspendStep string              // the step whose unknown outcome makes x end uncertain (Step); under mu
	journaled   bool                // a step is done in x's record (journaled by x, or found done): see keepsJournal; under mu
	mu          sync.Mutex
}

// Write captures response body bytes for storage. It keeps at most one byte
// over the stored-response limit and never fails; adapters call it with
// exactly the bytes sent to the client.
func (x *Execution) Write(p []byte) (int, error) {
	if x.bodyAt > 0 {
		if room := x.e.cfg.maxResponseBytes + 1 - (len(x.enc.b) - x.bodyAt); room > 0 {
			x.enc.b = append(x.enc.b, p[:min(len(p), room)]...)
		}
	} else if room := x.e.cfg.maxResponseBytes + 1 - len(x.body); room > 0 {
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
	if x.bodyAt > 0 {
		return
	}
	var stack [16]string
	src := headerLines(h, &stack)
	x.enc = x.e.encodeLines(&src, x.outer, len(x.body), x.buffer())
	x.bodyAt = len(x.enc.b)
	x.enc.b = append(x.enc.b, x.body...)
	x.body = nil
}

// Unreplayable declares that the response body is not visible to the
// adapter (e.g. a body stream written after the middleware returns). Finish
// then records it like a body above the stored-response limit: retries get
// 410 "response-not-stored", never a second execution.
func (x *Execution) Unreplayable() { x.unreplayable = true }

// Finish records the handler's response: status (0 means 200) and header as
// sent, and the body given to Write. Responses with status 2xx, 3xx and 4xx
// other than 408, 409, 425 and 429 are stored (all of them with
// [WithStoreAll]); others release the key so that a retry executes again
// (once a [Step] finished, the key's lease lapses at once instead and its
// journal is kept: the retry resumes after the last finished step).
// Store errors are logged and reported as events; the client's response is
// never changed by them.
func (x *Execution) Finish(status int, header http.Header) {
	status, ok := x.ending(status)
	if !ok {
		return
	}
	var location string                      // the Location line as sent, for response-not-stored
	if v := header["Location"]; len(v) > 0 { // as header.Get: the name is canonical
		location = v[0]
	}
	switch {
	case x.unreplayable || x.bodyLen() > x.e.cfg.maxResponseBytes:
		x.store(nil, status, location)
	case x.bodyAt > 0: // the header as snapshotted, the body from Write
		x.store(x.enc.encoding(status), status, location)
	default:
		var stack [16]string
		src := headerLines(header, &stack)
		x.store(x.encode(status, &src, x.body), status, location)
	}
}

// encode returns the encoding of a response with status, the lines of src
// worth replaying and body, in x.enc.
func (x *Execution) encode(status int, src *lineSource, body []byte) []byte {
	x.enc = x.e.encodeLines(src, x.outer, len(body), x.buffer())
	x.enc.b = append(x.enc.b, body...)
	return x.enc.encoding(status)
}

// encodings holds encoding buffers for reuse: a store keeps a copy of the
// response Complete is given, or sends it before returning (the copy rules
// of [Store]), so an execution's buffer is free once its completion or
// release has ended.
var encodings sync.Pool // of *encBuf

// encBuf is a buffer in encodings.
type encBuf struct{ b []byte }

// maxRecycled is the largest capacity of a buffer kept in encodings, in
// bytes; larger ones (large responses) are left to the GC.
const maxRecycled = 64 << 10

// buffer returns a buffer from encodings for x's encoding (nil when there
// is none), which recycle gives back.
func (x *Execution) buffer() []byte {
	if x.buf == nil {
		if x.buf, _ = encodings.Get().(*encBuf); x.buf == nil {
			return nil
		}
	}
	return x.buf.b
}

// recycle puts x's encoding buffer in encodings, once nothing reads it:
// the execution has ended (Finish's completion, a release, Fail).
func (x *Execution) recycle() {
	p := x.buf
	if b := x.enc.b; b != nil && cap(b) <= maxRecycled {
		if p == nil {
			p = new(encBuf)
		}
		p.b = b[:0]
	}
	x.enc, x.bodyAt, x.buf = encoder{}, 0, nil
	if p != nil {
		encodings.Put(p)
	}
}

// bodyLen is the length of the body given to Write.
func (x *Execution) bodyLen() int {
	if x.bodyAt > 0 {
		return len(x.enc.b) - x.bodyAt
	}
	return len(x.body)
}

// ending marks the handler as done and applies the storage policy to its
// status (0 means 200): it reports false when the key was released instead.
func (x *Execution) ending(status int) (int, bool) {
	x.finishing() // the lease stays renewed while completion is tried
	if step := x.suspending(); step != "" {
		x.answerOverride()
		x.suspend(step)
		x.stopRenewal()
		x.recycle()
		return status, false
	}
	if status == 0 {
		status = http.StatusOK
	}
	// A status outside 100-999 (RFC 9110 section 15) cannot be replayed:
	// release, whatever the storage policy says.
	if status < 100 || status > 999 || !x.e.cfg.storePolicy(status) {
		x.unstored()
		x.stopRenewal()
		x.recycle()
		return status, false
	}
	return status, true
}

// FinishLines is Finish for adapters of frameworks that keep the response
// in their own types (fasthttp: Fiber): lines (nil: none) holds the
// response header lines as sent, body the response body as sent (not
// retained). Both go through the same header policy and encoding as
// Finish's, with no http.Header in between. The body is given here, not
// through Write.
func (x *Execution) FinishLines(status int, lines *HeaderLines, body []byte) {
	status, ok := x.ending(status)
	if !ok {
		return
	}
	if lines == nil {
		lines = &noLines
	}
	location := lines.location()
	if x.unreplayable || len(body) > x.e.cfg.maxResponseBytes {
		x.store(nil, status, location)
		return
	}
	src := lineSource{l: lines}
	if lines.more != nil { // many or long lines
		var stack [16]string
		src = headerLines(lines.more, &stack)
	}
	x.store(x.encode(status, &src, body), status, location)
}

// store completes the record with the encoded response enc, or, when enc
// is nil (the body is not replayable) or the store refuses it as too
// large, with the response-not-stored problem.
func (x *Execution) store(enc []byte, status int, location string) {
	if enc == nil {
		enc = x.e.problems.notStored(status, location)
	}
	ev := x.event(EventCompleted)
	ev.Status = status
	err := x.complete(enc)
	if errors.Is(err, ErrTooLarge) {
		enc = x.e.problems.notStored(status, location)
		err = x.complete(enc)
	}
	if transient(err) { // a blip: try once more before the client gets its answer
		err = x.complete(enc)
	}
	if errors.Is(err, ErrNotOwner) && x.landed(enc) {
		err = nil // an attempt whose reply was lost or late did store it
	}
	if transient(err) && x.e.cfg.completionRetry > 0 && x.e.retryInBackground(x, enc, ev) {
		return
	}
	x.stopRenewal()
	x.reportCompletion(ev, err)
	x.recycle()
}

func (x *Execution) reportCompletion(ev Event, err error) {
	defer x.tell(err)
	if x.reported != nil {
		defer x.reported(err)
	}
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

func (x *Execution) complete(enc []byte) error {
	start := x.e.clock()
	var err error
	if x.e.local {
		err = x.storeComplete(x.ctx, enc)
	} else {
		ctx, cancel := x.e.storeCall(x.ctx)
		err = x.storeComplete(ctx, enc)
		cancel()
	}
	x.storeDur = x.e.clock().Sub(start)
	return err
}

// storeComplete completes through x's Unit when it has one, else the Store.
func (x *Execution) storeComplete(ctx context.Context, enc []byte) error {
	if x.unit != nil {
		return x.unit.Complete(ctx, enc, x.pol.retention)
	}
	return x.e.store.Complete(ctx, x.ev.Key, x.token, enc, x.pol.retention)
}

// retryInBackground keeps renewing the lease and retries Complete with
// backoff for up to the completion-retry window, so that a store blip after
// the handler ran does not let a retry execute it again. It reports false
// when the engine is closed.
func (e *Engine) retryInBackground(x *Execution, enc []byte, ev Event) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer x.stopRenewal()
		defer x.recycle()
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
			if err = x.complete(enc); errors.Is(err, ErrNotOwner) && x.landed(enc) {
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

// landed reports whether the key holds this execution's completed record,
// enc: after [ErrNotOwner] from Complete, an earlier attempt whose reply
// was lost (connection cut, reply later than the store timeout, or a
// client-side retry of a command that had run) may have stored it. Stores
// that drop the token on completion are matched by fingerprint and
// response bytes, so that a takeover's completion is not taken for this one.
func (x *Execution) landed(enc []byte) bool {
	ctx, cancel := x.e.storeCall(x.ctx)
	defer cancel()
	rec, found, err := x.e.store.Get(ctx, x.ev.Key)
	if err != nil || !found || rec.State != StateCompleted || rec.Fingerprint != x.fp {
		return false
	}
	if rec.Token != "" {
		return rec.Token == x.token
	}
	return bytes.Equal(rec.Response, enc)
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

// Override returns the answer idem sends in place of the handler's, nil
// while the handler's own goes out: once a [Step] in the handler found a
// step's outcome unknown ([ErrStepUncertain]), the 409
// "operation-uncertain" problem, whatever the handler writes afterwards
// (its record ends uncertain; nothing after the step runs through idem:
// later Steps refuse, the Unit is rolled back). [CaptureWriter] applies
// it; adapters with writers of their own check it before the handler's
// first write and when the handler ended, send it instead (with the
// header as it was when the execution began, [ResetHeader]) and drop the
// handler's writes; gRPC and Connect answer its status instead of the
// handler's reply.
func (x *Execution) Override() *Response {
	if x.suspending() == "" {
		return nil
	}
	return x.e.problems.uncertain
}

// answerOverride sends the override through x's CaptureWriter when the
// handler wrote nothing.
func (x *Execution) answerOverride() {
	if x.cw != nil {
		x.cw.overridden()
	}
}

// Fail releases the key after a handler error without a response, so that
// a retry executes again (once a [Step] finished, it lets the lease lapse
// at once and keeps the journal instead, as Finish does).
func (x *Execution) Fail() {
	x.finishing()
	if step := x.suspending(); step != "" {
		x.answerOverride()
		x.suspend(step)
	} else {
		x.unstored()
	}
	x.stopRenewal()
	x.recycle()
}

// unstored ends x, whose handler ended without an answer to store:
// released, so that a retry executes again. When x's record may hold a
// journal (keepsJournal) or x is a [Recoverer]'s run, it is left to lapse
// at once instead ([Execution.abandon]), its journal (and recovery
// payload) kept: a release would delete the steps done, and the retry
// would run a step that is not [Repeatable] again. Released anyway when
// x's [Unit] cannot roll back without releasing (not a [RollbackUnit]).
func (x *Execution) unstored() {
	if x.recovering || x.keepsJournal() {
		if _, ok := x.unit.(RollbackUnit); x.unit == nil || ok {
			x.abandon()
			return
		}
	}
	x.release()
}

// keepsJournal reports whether x's record may hold a step journal that an
// end without an answer must keep: a [Step] of x journaled its outcome or
// found it journaled, or x took the record over from a holder that
// stopped (its steps are journaled there). Steps only started (fn
// returned a transient error or panicked: no effect, or one safe to
// repeat) do not count.
func (x *Execution) keepsJournal() bool {
	if x.e.journal == nil {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.journaled || x.tookOver
}

// markJournaled records that a step is done in x's record.
func (x *Execution) markJournaled() {
	x.mu.Lock()
	x.journaled = true
	x.mu.Unlock()
}

func (x *Execution) release() {
	start := x.e.clock()
	ctx, cancel := x.e.storeCall(x.ctx)
	var err error
	if x.unit != nil {
		err = x.unit.Release(ctx)
	} else {
		err = x.e.store.Release(ctx, x.ev.Key, x.token)
	}
	cancel()
	x.tell(errRecoveryReleased)
	ev := x.ended(x.ev, OpRelease, x.e.clock().Sub(start))
	switch {
	case errors.Is(err, ErrNotOwner):
		x.e.emitErr(x.ctx, ev, EventLeaseLost, err, "idem: lease lost before release")
	case err != nil:
		x.e.emitErr(x.ctx, ev, EventStoreError, err, "idem: release failed; retrying in the background")
		x.e.releaseLater(x.ctx, x.ev, x.token, x.pol.lease)
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

// startRenewal registers x with the engine's renewals when its store can
// renew leases and does I/O.
func (x *Execution) startRenewal() {
	if x.e.extender != nil && !x.e.local {
		x.renewing = true
		x.e.renewals.add(x)
	}
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

func (*detached) Done() <-chan struct{} { return nil }

func (*detached) Err() error { return nil }

func (d *detached) Value(key any) any { return d.parent.Value(key) }

// stopRenewal ends x's renewals; a renewal under way still ends.
func (x *Execution) stopRenewal() {
	if x.renewing {
		x.e.renewals.remove(x)
	}
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
