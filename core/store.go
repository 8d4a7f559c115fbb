package idem

import (
	"context"
	"errors"
	"time"
)

// ErrNotOwner is returned by [Store.Complete], [Store.Release] and [Extender.Extend]
// when the caller's token does not hold a live lease on the key: the record is
// absent, expired, completed, or leased to another token, or the caller's lease
// has lapsed. It is a decision, not a system failure.
var ErrNotOwner = errors.New("idem: token does not own the in-progress record")

// ErrTooLarge is returned (wrapped) by [Store.Complete] when the response
// does not fit the store's record size limit (e.g. MongoDB's 16 MiB
// document). Nothing is written and the caller keeps its lease; the [Engine]
// then completes the record with a small "response-not-stored" problem.
var ErrTooLarge = errors.New("idem: response too large for the store")

// ErrNotDurable is returned (wrapped) by [Store.Complete] when the response
// was stored but its durability could not be confirmed (e.g. Redis WAIT saw
// fewer replicas than asked). The engine counts the record as completed and
// logs a warning.
var ErrNotDurable = errors.New("idem: response stored but its durability is not confirmed")

// ErrCorrupt is returned (wrapped) by a [Store] method when the key holds a
// value the store cannot decode: a corrupt record, or a foreign value
// written under the key by something else. The [Engine] answers such a key
// with 500 "stored-result-unreadable" (never executing the request again,
// since the record may be a completed one) until an operator deletes it.
var ErrCorrupt = errors.New("idem: stored record unreadable")

// ErrInvalidDuration is returned by a [Store] method given a lease or retention
// that is not > 0.
var ErrInvalidDuration = errors.New("idem: lease and retention must be > 0")

// State is the state of a stored record. Records move
// absent → in-progress → completed → expired. An in-progress record whose
// lease lapsed is taken over by the next request (it behaves as absent)
// unless it was acquired under [Keep.Uncertain]: then it stays, uncertain,
// until an operator resolves it or its keep ends. An expired record behaves
// as absent unless it completed under [Keep.Tombstone]: then its tombstone
// (fingerprint, no response) stays for that long. State has no value for
// absent.
type State uint8

const (
	// StateInProgress: a request holds the lease and its handler is running.
	StateInProgress State = iota + 1
	// StateCompleted: the response is stored and is replayed until retention ends.
	StateCompleted
	// StateUncertain: the lease of an in-progress record acquired under
	// [Keep.Uncertain] lapsed without a completion, so its handler may or
	// may not have had its effects (the holder crashed mid-request). No
	// request executes the key again until an operator resolves it
	// ([Keeper.Resolve], cmd/idemctl) or the keep ends.
	StateUncertain
	// StateExpired: a completed record, acquired under [Keep.Tombstone],
	// whose retention ended: its response is gone, its fingerprint stays
	// as a tombstone, so a late retry is refused instead of executed again.
	StateExpired
)

// String returns "in-progress", "completed", "uncertain", "expired" or "unknown".
func (s State) String() string {
	switch s {
	case StateInProgress:
		return "in-progress"
	case StateCompleted:
		return "completed"
	case StateUncertain:
		return "uncertain"
	case StateExpired:
		return "expired"
	}
	return "unknown"
}

// Record is what a [Store] returns for a live (non-expired) key.
type Record struct {
	// State is StateInProgress or StateCompleted, or, in a [Keeper] store,
	// StateUncertain or StateExpired.
	State State
	// Fingerprint is the fingerprint of the request that created the record
	// (see [Fingerprint]); it survives completion.
	Fingerprint string
	// Token is the owner of the in-progress lease (and of an uncertain
	// record); empty for completed and expired records in stores that drop it.
	Token string
	// Response is, for a completed record, the bytes given to
	// [Store.Complete], unchanged: the [Engine]'s encoding of the response,
	// opaque to stores ([DecodeResponse] reads it). nil in every other state.
	Response []byte
	// LeaseLeft is, for an in-progress record, the time left on its lease
	// by the store's clock when the store read it, or 0 when the store does
	// not tell (always 0 for completed records). Optional: a store fills it
	// in Acquire when that is cheap (in the same round trip, or one more
	// call on the in-progress path only, never on a fresh request's); the
	// [Engine] reads it there to tell a holder that renews its lease from
	// one that stopped, for the 409's Retry-After. When filled it is > 0
	// and at most the lease last given by Acquire or [Extender.Extend].
	LeaseLeft time.Duration
}

// Store keeps idempotency records; the [Engine] calls it, never
// applications. Every method is one atomic operation on the store (no
// check-then-set across round trips), so that many server instances
// sharing one store execute each key at most once.
//
// Keys are the hashed scoped keys built by the [Engine] (64 hex characters).
// Tokens are random strings identifying one execution. Durations must be > 0,
// else [ErrInvalidDuration]. A method given an already cancelled or expired
// context returns its error (context.Canceled or context.DeadlineExceeded)
// without side effects. err is for system failures only (store unreachable,
// timeout; a record it cannot read wraps [ErrCorrupt]); decisions are
// reported through return values and [ErrNotOwner].
//
// Responses are bytes: the engine encodes a response before
// [Store.Complete] and decodes what [Store.Acquire] returns; a store keeps
// the bytes exactly (never empty; any byte values, any length up to its
// limit, see [ErrTooLarge]) and never parses them. Copy rules:
//   - Complete's response is the caller's: the store reads it during the
//     call only and keeps a copy (or the data sent to its server).
//   - Get's Record.Response (and [Inspector.Inspect]'s) is the caller's to
//     keep and modify: a copy.
//   - Acquire's Record.Response is read-only for the caller, who keeps it:
//     the engine replays from it in place, concurrently with other
//     replays. A store may hand the same bytes to many callers, but never
//     modifies bytes it handed out (it replaces a record, never edits it
//     in place).
//
// core/storetest.Run checks every rule here.
type Store interface {
	// Acquire creates an in-progress record owned by token, holding a lease
	// of the given duration, when the key is absent, expired, or in-progress
	// with a lapsed lease (takeover), and reports acquired = true. Otherwise
	// it returns the live record unchanged (in-progress, or completed with
	// its Response) and acquired = false, so the engine can decide replay,
	// conflict or mismatch from the same round trip. When acquired is
	// true rec is the zero Record, except in a [Journal] store taking a
	// lapsed lease over (see [Journal]: the previous holder's Token,
	// LeaseLeft < 0).
	Acquire(ctx context.Context, key, token, fingerprint string, lease time.Duration) (rec Record, acquired bool, err error)

	// Complete stores response, the engine's encoding of the response, for
	// the key and marks it completed, keeping its fingerprint, for
	// retention counted from now. Only the token holding a live lease may
	// complete; otherwise it returns [ErrNotOwner]. A response above the
	// store's size limit returns [ErrTooLarge] and changes nothing.
	Complete(ctx context.Context, key, token string, response []byte, retention time.Duration) error

	// Release deletes the in-progress record held by token so that a retry
	// executes again. It never deletes a completed record or another token's
	// lease; in those cases, and when the lease has lapsed, it returns [ErrNotOwner].
	Release(ctx context.Context, key, token string) error

	// Get returns the live record for key, found = false when it is absent
	// or expired. The engine calls it only to learn whether a Complete
	// whose reply was lost did land; operators' tools read records with
	// it or with [Inspector].
	Get(ctx context.Context, key string) (rec Record, found bool, err error)
}

// Extender is implemented by stores that can renew a lease. The [Engine]
// renews the lease of a running handler every lease/3 when the store
// implements it; without it a handler slower than the lease can be joined by a
// second execution after the lease lapses.
type Extender interface {
	// Extend resets the lease of the in-progress record held by token to the
	// given duration from now. It returns [ErrNotOwner] when token does not
	// hold a live lease.
	Extend(ctx context.Context, key, token string, lease time.Duration) error
}

// LocalStore is implemented by stores whose records live in the process's
// memory and die with it (memstore), when Local returns true. The [Engine]
// then calls them without a timeout context, and, when the store is also
// an [Extender], takes leases that never lapse on their own and are never
// renewed: a key is held until Finish, Fail or Abort, since no crashed
// holder can strand it (the crash empties the store). A store that keeps
// records anywhere that outlives the process (a file, shared memory, a
// server) must not report true: after a crash its in-progress keys would
// stay in progress for about 146 years.
type LocalStore interface {
	// Local reports whether the store's records live in this process's
	// memory only, and its calls do no I/O.
	Local() bool
}

// Transactional is implemented by stores that can commit a handler's own
// writes in the same transaction as its completed record (Stripe's "atomic
// phases"), e.g. a SQL store whose handlers write to the same database:
// either the writes and the completion both persist, or neither does, even
// when the process dies or its lease is taken over before the completion.
//
// The [Engine] asks for one [Unit] per execution when the adapter binds the
// handler's context ([Execution.WithInfo]), and then completes or releases
// through that Unit instead of the Store. Handlers reach their Unit with
// [UnitFromContext], usually through a store helper (e.g. pgstore.Tx).
type Transactional interface {
	// Unit returns the unit of work of the execution that holds token's
	// lease on key. It must do no I/O: a store opens its transaction
	// lazily, when the handler first asks for it, so handlers that never
	// use it cost nothing extra.
	Unit(key, token string) Unit
}

// Unit is one execution's transaction in a [Transactional] store. The
// engine ends it with Complete (possibly called again after an error, as
// [Store.Complete] is) or Release; handlers must not use the transaction
// after their handler returned.
type Unit interface {
	// Complete is [Store.Complete] for this execution, inside its
	// transaction: the conditional update (token still holds a live lease)
	// and the commit of the handler's writes succeed or fail together.
	// When the lease was lost it rolls the handler's writes back and
	// returns [ErrNotOwner]. A call after a failed commit returns nil only
	// if the commit did land (record completed under this token), else
	// [ErrNotOwner]: the writes are gone and must not be answered for.
	// [ErrTooLarge] and [ErrInvalidDuration] leave the transaction open.
	// response follows [Store.Complete]'s rules.
	Complete(ctx context.Context, response []byte, retention time.Duration) error
	// Release is [Store.Release] for this execution, after rolling back
	// the handler's writes (which happens even if the release fails).
	Release(ctx context.Context) error
}

// Keep is how long a [Keeper] store keeps a record past its lease and its
// retention. A record carries the Keep it was acquired with through its
// later transitions ([Extender.Extend], [Store.Complete], [Unit.Complete]);
// every call honours a stored record's state whatever Keep it is given, so
// instances configured differently (a rolling deploy) agree on each record.
// The zero Keep is plain [Store.Acquire]: takeover, no tombstone.
type Keep struct {
	// Uncertain > 0 keeps an in-progress record whose lease lapsed without a
	// completion as [StateUncertain] for Uncertain after the lapse, instead
	// of letting the next Acquire take it over (at-most-once recovery);
	// then it expires. While it is uncertain its own token still owns it:
	// a holder that was only slow may Complete, Release or Extend it.
	Uncertain time.Duration
	// Tombstone > 0 keeps, after a completed record's retention ends, its
	// tombstone (fingerprint, no response) for Tombstone more, returned by
	// Acquire as [StateExpired]; then it expires. Its store must free the
	// response when the retention ends, not when the tombstone does.
	Tombstone time.Duration
}

// Keeper is implemented by stores that can keep records past their lease
// and retention ([Keep]): the [Engine] needs it for [WithUncertainAfterCrash]
// and [WithTombstones]. Like every [Store] method, each method is one
// atomic operation; core/storetest.RunKeeper checks implementations.
type Keeper interface {
	// AcquireKeep is [Store.Acquire] under keep: it creates the record as
	// Acquire does, carrying keep, and answers a live record as Acquire
	// does, plus two cases that are never taken over: an uncertain record
	// (State [StateUncertain], its Fingerprint and Token) and a tombstone
	// (State [StateExpired], its Fingerprint, no Response), both with
	// acquired = false. Acquire(...) is AcquireKeep(..., Keep{}). Negative
	// keep durations are [ErrInvalidDuration].
	AcquireKeep(ctx context.Context, key, token, fingerprint string, lease time.Duration, keep Keep) (rec Record, acquired bool, err error)

	// Resolve ends an uncertain record, for an operator who learned the
	// operation's outcome: with a nil response it deletes the record, so
	// the next request with the key executes; otherwise it completes it
	// with response for retention (and the record's tombstone after it),
	// so retries replay it. A record that is not uncertain (absent,
	// in-progress with a live lease, completed, expired) is left unchanged
	// and [ErrRecordChanged] is returned.
	Resolve(ctx context.Context, key string, response []byte, retention time.Duration) error
}
