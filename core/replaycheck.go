package idem

import "context"

// ReplayInfo is what a replay check ([WithReplayCheck]) learns about a
// request whose idempotency key already holds a record. Its principal and
// route are the new request's; they name the same record as the request
// that created it, since both are part of the scope.
type ReplayInfo struct {
	// Key is the scoped, hashed key (64 hex characters, [ScopedKey]).
	Key string
	// Method, Route, Path and Principal are the new request's, as the
	// adapter reported them (Route may be empty: the scope then uses Path).
	Method, Route, Path, Principal string
	// State is the stored record's: StateCompleted for a replay (and for a
	// mismatch on a completed record), StateUncertain or StateExpired for
	// those records ([Keep]), StateInProgress otherwise.
	State State
	// Status is the stored response's status (for a response too large to
	// store, 410), when State is StateCompleted and the answer is a
	// replay; 0 otherwise.
	Status int
	// Outcome is what the engine answers when the check passes:
	// EventReplayed (the stored response), EventConflict (409),
	// EventMismatch (422 "key-reused"), EventFingerprintChanged (422
	// "fingerprint-changed"), EventUncertain (409 "operation-uncertain") or
	// EventKeyExpired (410 "key-expired").
	Outcome EventKind
}

// WithReplayCheck runs fn before every answer that reveals a stored record
// of the key: a replay, 409 in progress, and 422 key-reused or
// fingerprint-changed, so that a caller whose permission was revoked
// after the first request gets none of its outcome (as LabStack Echo
// Pro's ReplayCheck). When fn returns an
// error the answer is 403 problem "replay-forbidden" instead, carrying
// nothing stored (no body, no stored header, no Idempotent-Replayed), and
// the event [EventReplayForbidden] reports the error; the handler does not
// run. fn runs on the request's goroutine with its context, after the
// store call (under [WithWait], once the wait has ended); it must be safe
// for concurrent use. Requests that execute never reach it: the handler's
// own authorization covers them. Optional. Default is none: the scope
// (principal, method, route) is the only check.
func WithReplayCheck(fn func(ctx context.Context, info ReplayInfo) error) Option {
	return func(c *config) { c.replayCheck = fn }
}

// forbidden runs the replay check for an answer of kind outcome about the
// stored record rec, and returns the 403 to send instead, or nil.
func (e *Engine) forbidden(ctx context.Context, req *Request, ev Event, state State, status int, outcome EventKind) *Response {
	if e.cfg.replayCheck == nil {
		return nil
	}
	err := e.cfg.replayCheck(ctx, ReplayInfo{Key: ev.Key, Method: req.Method, Route: req.Route, Path: req.Path,
		Principal: req.Principal, State: state, Status: status, Outcome: outcome})
	if err == nil {
		return nil
	}
	ev.Kind, ev.Err = EventReplayForbidden, err
	e.emit(ctx, ev)
	return e.problems.forbidden
}
