package idem

import (
	"context"
	"time"
)

// EventKind names what the engine did with a request.
type EventKind uint8

// Event kinds, reported to the hook set with [WithEventHook].
const (
	EventAcquired           EventKind = iota + 1 // lease taken; the handler runs
	EventReplayed                                // stored response replayed
	EventConflict                                // 409: the key is in progress
	EventMismatch                                // 422: the key was used with another fingerprint
	EventRejected                                // 400, 401 or 413: bad key, no principal or body too large
	EventCompleted                               // response stored (Err is set when its durability is not confirmed)
	EventReleased                                // key released after a 5xx, error or panic
	EventLeaseLost                               // another request took the key over, or the lease lapsed
	EventStoreError                              // the store failed; Err says how
	EventUnprotected                             // no key under WithKeyOptional: the handler ran unprotected
	EventReplayForbidden                         // 403: the WithReplayCheck function refused; Err says why
	EventFingerprintChanged                      // 422: the key's record was fingerprinted by a function this engine does not know
	EventUncertain                               // 409: the key's holder crashed mid-request; an operator must resolve it (WithUncertainAfterCrash)
	EventKeyExpired                              // 410: the key's response is no longer stored, its tombstone is (WithTombstones)
	EventTakeover                                // a lapsed lease was taken over (its holder crashed or stalled, or an operator resolved a step: ResolveStep); EventAcquired follows
	EventRecoveryStarted                         // a Recoverer claimed a record whose holder stopped and runs it again; EventTakeover and EventAcquired follow
	EventRecovered                               // a Recoverer's run stored the execution's answer (Status)
	EventRecoveryDeferred                        // a Recoverer's run ended without an answer to store (error, 5xx, panic, refused on its way): the record is due again after its backoff
	EventRecoveryParked                          // a record's recovery attempts are exhausted: it is uncertain until an operator resolves it (idemctl list -state uncertain)
	EventRecoveryRefused                         // 403: a request carried an Idem-Recovery nonce no pending recovery run issued, or ran as another request than its claim
	EventRecoveryPass                            // a Recoverer's pass ended; Pass counts the due records it saw, claimed, recovered, deferred and parked
	EventAbandoned                               // an execution whose record holds a journal (a Step started, or a takeover) ended without an answer to store (error, 5xx, panic): not released, its lease lapses at once and the journal is kept, so the retry resumes after its last finished step
)

var eventNames = [...]string{"", "acquired", "replayed", "conflict", "mismatch", "rejected", "completed", "released", "lease-lost", "store-error", "unprotected",
	"replay-forbidden", "fingerprint-changed", "uncertain", "key-expired", "takeover",
	"recovery-started", "recovered", "recovery-deferred", "recovery-parked", "recovery-refused", "recovery-pass", "abandoned"}

// String returns the event's name, e.g. "replayed".
func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// StoreOp names a [Store] method the engine called.
type StoreOp uint8

// Store operations, reported in [Event.Op].
const (
	OpAcquire     StoreOp = iota + 1 // Store.Acquire
	OpComplete                       // Store.Complete
	OpRelease                        // Store.Release
	OpExtend                         // Extender.Extend (lease renewal)
	OpSuspend                        // Journal.Suspend (a step's outcome is unknown)
	OpSetRecovery                    // Recoverable.SetRecovery
	OpClaim                          // Recoverable.Claim
	OpLapsed                         // Recoverable.Lapsed
)

var opNames = [...]string{"", "acquire", "complete", "release", "extend", "suspend", "set-recovery", "claim", "lapsed"}

// String returns the operation's name, e.g. "acquire", or "" for none.
func (o StoreOp) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "unknown"
}

// Event describes one decision or failure of the engine. Its fields carry
// what a metrics or tracing exporter needs (see observability/idemotel);
// none carries the raw idempotency key or the principal.
type Event struct {
	Kind EventKind
	// Key is the scoped, hashed key (64 hex characters, [ScopedKey], never
	// the raw idempotency key); empty for rejected requests.
	Key string
	// Method is the request's method, e.g. "POST".
	Method string
	// Route is the route template the adapter reported, e.g.
	// "/v1/payments/:id"; empty when it reported none (the scope then uses
	// the path, which events leave out: metric labels must stay bounded).
	Route string
	// Status is the handler's status, for EventCompleted.
	Status int
	// Err is the cause, for EventRejected, EventLeaseLost, EventStoreError
	// and EventReplayForbidden.
	Err error
	// Op is the store call the event reports: OpAcquire for acquired,
	// replayed, conflict, mismatch, fingerprint-changed and
	// replay-forbidden; the failed call for lease-lost and
	// store-error; OpComplete for completed; OpRelease for released. 0 for
	// rejected requests, which reach no store.
	Op StoreOp
	// StoreDuration is how long that call took, up to the store timeout (the
	// last attempt when a duplicate waited with [WithWait] or a completion
	// was retried). 0 when Op is 0. Successful lease renewals report no event.
	StoreDuration time.Duration
	// HandlerDuration is how long the handler ran, from the acquisition to
	// Finish, Fail or Abort; set only when Ended is true.
	HandlerDuration time.Duration
	// PreviousOwner is, for EventTakeover, the lease token of the holder
	// whose lease lapsed ("host:pid:random.n", see [TokenOwner]).
	PreviousOwner string
	// Lapsed is, for EventTakeover, how long the previous lease had lapsed
	// when it was taken over.
	Lapsed time.Duration
	// Pass is, for EventRecoveryPass, what the pass did (nil for every
	// other kind); the hook must not keep it past its call.
	Pass *RecoveryReport
	// Ended is true on the one event that ends an execution announced by
	// EventAcquired: its completion or release (completed, released, or
	// lease-lost or store-error at completion or release). Events while the
	// handler runs (lease renewal) and background releases have it false, so
	// executions in progress = acquired events - ended events.
	Ended bool
}

// clock returns the time for an [Event]'s durations: time.Now with an
// event hook, else the zero time, sparing the request path clock reads
// (about 50ns each on a VM) that nobody would see.
func (e *Engine) clock() time.Time {
	if e.cfg.onEvent == nil {
		return time.Time{}
	}
	return time.Now()
}

func (e *Engine) emit(ctx context.Context, ev Event) {
	if e.cfg.onEvent != nil {
		e.cfg.onEvent(ctx, ev)
	}
}

func (e *Engine) emitErr(ctx context.Context, ev Event, k EventKind, err error, msg string) {
	ev.Kind, ev.Err = k, err
	key := ev.Key
	if len(key) > 16 {
		key = key[:16]
	}
	e.cfg.logger.WarnContext(ctx, msg, "key", key, "method", ev.Method, "route", ev.Route, "err", err)
	e.emit(ctx, ev)
}
