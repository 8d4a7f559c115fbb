package idem

import "context"

// EventKind names what the engine did with a request.
type EventKind uint8

// Event kinds, reported to the hook set with [WithEventHook].
const (
	EventAcquired   EventKind = iota + 1 // lease taken; the handler runs
	EventReplayed                        // stored response replayed
	EventConflict                        // 409: the key is in progress
	EventMismatch                        // 422: the key was used with another fingerprint
	EventRejected                        // 400, 401 or 413: bad key, no principal or body too large
	EventCompleted                       // response stored (Err is set when its durability is not confirmed)
	EventReleased                        // key released after a 5xx, error or panic
	EventLeaseLost                       // another request took the key over, or the lease lapsed
	EventStoreError                      // the store failed; Err says how
)

var eventNames = [...]string{"", "acquired", "replayed", "conflict", "mismatch", "rejected", "completed", "released", "lease-lost", "store-error"}

// String returns the event's name, e.g. "replayed".
func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// Event describes one decision or failure of the engine.
type Event struct {
	Kind EventKind
	// Key is the scoped, hashed key (never the raw idempotency key); empty
	// for rejected requests.
	Key    string
	Method string
	Route  string
	// Status is the handler's status, for EventCompleted.
	Status int
	// Err is the cause, for EventRejected, EventLeaseLost and EventStoreError.
	Err error
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
