package idem

import (
	"context"
	"time"
)

// MaxRecoveryBytes is the largest recovery payload ([Recoverable.SetRecovery])
// a store accepts, in bytes; a larger one is refused with [ErrTooLarge].
// It bounds what the engine keeps to run an execution again without its
// client: the request's method, route, target, principal, declared header
// lines and body (an [Operation]'s name, scope, key, input and payload).
const MaxRecoveryBytes = 1 << 20

// LapsedRecord is one record a [Recoverable] store reports as due for
// recovery ([Recoverable.Lapsed]).
type LapsedRecord struct {
	// Key is the record's scoped key (64 hex characters).
	Key string
	// Attempts is the number of [Recoverable.Claim]s the record has had.
	Attempts int
}

// RecoveryClaim is what [Recoverable.Claim] returns for a record it took
// over.
type RecoveryClaim struct {
	// Payload is the recovery payload given to [Recoverable.SetRecovery]
	// (a copy, the caller's).
	Payload []byte
	// Fingerprint is the record's fingerprint.
	Fingerprint string
	// Attempts counts the claims of the record, this one included (1 for
	// the first).
	Attempts int
	// PreviousToken is the token of the holder whose lapsed lease the
	// claim took over.
	PreviousToken string
	// Lapsed is how long that lease had lapsed, by the store's clock (> 0).
	Lapsed time.Duration
}

// Recoverable is implemented by [Journal] stores that keep, in an
// in-progress record, what a recoverer needs to run its execution again
// when its holder stopped (crashed, or stalled past its lease) and no
// client comes back (Stripe API v2's "retries failed or partially failed
// work to completion"; DBOS's recoverPendingWorkflows; Brandur's
// "completer"). The engine calls SetRecovery for executions of routes and
// operations that opt in, before their handler runs; a recoverer finds
// their records with Lapsed once their lease lapsed and takes each over
// with Claim, fenced exactly as a client retry's [Store.Acquire] is, so
// that finished steps replay and the answer is stored for the client's
// eventual retry.
//
// A record with a recovery payload lives as a record with a started step
// does ([Journal]): it outlives a lapse of its lease by the retain given,
// and dies with Release, [Inspector.Evict], expiry, or completion (its
// payload is dropped when it completes). Once its lease lapsed,
// [Store.Acquire] or [Keeper.AcquireKeep] with another fingerprint gets it
// unchanged, acquired = false, as for a non-empty journal, so that the
// recoverer finishes the original request and its client's retry gets the
// replay. A record that turns uncertain ([Journal.Suspend], or a lapse under
// [Keep.Uncertain]) keeps its payload but is not due: once an operator
// settles its step ([StepResolver]) it is in progress with a lapsed lease
// again, and due. Each method is one atomic operation;
// core/storetest.RunRecovery checks implementations.
type Recoverable interface {
	// SetRecovery stores payload (opaque to stores; not empty; at most
	// [MaxRecoveryBytes], else [ErrTooLarge]; the store keeps a copy) in
	// the in-progress record whose live lease token holds, replacing any
	// earlier payload, and makes the record outlive a lapse of its lease
	// by retain (> 0, else [ErrInvalidDuration]; the largest retain given
	// to it or to [Journal.StartStep] wins) and be reported by Lapsed once
	// its lease lapsed (a record acquired under [Keep.Uncertain] turns
	// uncertain instead, and is not). It keeps lease (> 0, else
	// [ErrInvalidDuration]; the engine gives the lease of the record's
	// route) with the payload: the lease a Claim of the record takes. An
	// empty payload is an error. [ErrNotOwner] when token does not hold a
	// live lease.
	SetRecovery(ctx context.Context, key, token string, payload []byte, retain, lease time.Duration) error

	// Lapsed returns up to limit (> 0) records that are due: in progress,
	// with a recovery payload, whose lease lapsed at least the backoff the
	// last Claim gave ago (at once when never claimed), soonest due first
	// where the store indexes it. It is a hint, bounded and never blocking
	// the store (an indexed range scan; a sorted set in Redis): a record
	// it returns may have changed since (Claim decides), but a record
	// that stays due is returned by some later call, however many records
	// are due (a Claim that finds a record not due, or gone, takes it out
	// of the way). Its cost depends on the records due (and those in
	// flight with a payload), never on completed ones: a completed record
	// is in no index it reads, so a record due behind any history of
	// completed ones is returned by the first call
	// (core/storetest.RunRecovery checks it).
	Lapsed(ctx context.Context, limit int) ([]LapsedRecord, error)

	// Claim takes over the due record for key (see Lapsed), for token
	// holding the lease its last SetRecovery kept with the payload (the
	// lease given here only for a record whose payload a store version
	// before that lease was kept stored without one), exactly as
	// [Store.Acquire] takes a lapsed lease over (its journal and payload
	// kept), in its one atomic operation, counts one
	// more attempt, and remembers backoff (>= 0): if this claim's lease
	// lapses in turn, the record is due backoff after that lapse. It
	// returns the record's payload, fingerprint and attempts with the
	// previous holder's token, claimed = true. A record that is not due
	// (absent, expired, completed, uncertain, its lease live, in backoff,
	// or without a payload) is left unchanged (beyond its place among the
	// hints of Lapsed) and claimed = false.
	Claim(ctx context.Context, key, token string, lease, backoff time.Duration) (claim RecoveryClaim, claimed bool, err error)
}

// StepResolver is implemented by [Journal] stores that let an operator
// settle a step whose outcome is unknown (a holder stopped inside a step
// that is not [Repeatable]: the execution ended uncertain) and let the
// execution resume after it, instead of resolving the whole record
// ([Keeper.Resolve]: completing it without the handler's later work, or
// deleting it so that every step runs again). cmd/idemctl resolve-step
// calls it through [ResolveStep]; core/storetest.RunRecovery checks
// implementations.
type StepResolver interface {
	// ResolveStep settles step name of the record for key, which must be
	// uncertain ([StateUncertain], e.g. after [Journal.Suspend]) or in
	// progress with a lapsed lease, and hold a started entry of that name
	// that is not done: with a result (not nil, at most [MaxStepBytes],
	// else [ErrTooLarge]) the entry becomes done with it, as
	// [Journal.FinishStep] would have made it; with nil the entry is
	// removed (the step did not happen: it runs when the handler resumes,
	// its [Journal.StartStep] a new entry of the new holder's token, after
	// the entries kept, which stay in start order).
	// The record becomes (or stays) in progress with its lease lapsed, its
	// token, fingerprint, journal and payload kept, for the retain it had,
	// so that the next [Store.Acquire] with its fingerprint, or a
	// recoverer's [Recoverable.Claim], takes it over and the handler
	// resumes. Its recovery attempts count from 0 again and its backoff is
	// 0 (an operator settled what stopped it): a recoverer's Claim finds it
	// due at once and reports Attempts 1. Any other record (absent, live lease, completed, expired, no
	// such step, the step done) is left unchanged and [ErrRecordChanged]
	// returned.
	ResolveStep(ctx context.Context, key, name string, result []byte) error
}
