package idem

import (
	"context"
	"errors"
	"time"
)

// Limits of a step journal ([Journal]), the same in every store.
const (
	// MaxSteps is the number of steps one record's journal holds; a
	// [Journal.StartStep] of one more returns [ErrTooManySteps].
	MaxSteps = 64
	// MaxStepBytes is the largest encoded step result, in bytes; [Step]
	// returns [ErrStepTooLarge] for a larger one and stores refuse it with
	// [ErrTooLarge].
	MaxStepBytes = 64 << 10
	// MaxStepName is the longest step name, in bytes. Names are made of
	// ASCII letters, digits, '-', '_', ':' and '/' ([Step] refuses others),
	// so stores can use them as field names and JSON paths unquoted.
	MaxStepName = 128
)

// ErrTooManySteps is returned by [Journal.StartStep] (and so by [Step])
// when the record's journal already holds [MaxSteps] steps.
var ErrTooManySteps = errors.New("idem: step journal full")

// StepEntry is one step of a record's journal ([Journal]).
type StepEntry struct {
	// Name is the step's name, given to [Step].
	Name string
	// Token is the lease token of the execution that started the step
	// (first started it: a repeat by a later holder keeps it).
	Token string
	// Done is true once the step's outcome is journaled in Result.
	Done bool
	// Result is the step's outcome as [Step] encoded it (opaque to
	// stores), nil while not Done.
	Result []byte
}

// Journal is implemented by stores that keep a step journal in each record,
// for [Step]: the outcome of each named step of an execution, so that an
// execution that takes a lapsed lease over resumes after the last finished
// step instead of running every effect again (DBOS's RunAsStep, Restate's
// journal). A Journal store is also a [Keeper] and an [Extender].
//
// The journal lives and dies with its record: an Acquire that creates the
// record (absent, expired, released, evicted, resolved with nil) starts
// it empty; once a step is started, an in-progress record whose lease
// lapses is kept, with its journal, for the retain given to StartStep
// after its lease end (instead of expiring with the lease), so that a
// retry can take it over and resume (a record under [Keep.Uncertain] turns
// uncertain as usual; [Extender.Extend] keeps retain past the new lease
// end); Complete, [Unit.Complete] and [Keeper.Resolve] with a response
// keep it until the retention ends (a tombstone has none); Release,
// [Inspector.Evict] and expiry delete it. An Acquire that takes over a lapsed
// in-progress record with the same fingerprint keeps it; one with another
// fingerprint takes the record over (journal emptied) only when the journal
// is empty (and the record has no [Recoverable] payload), else answers the
// in-progress record unchanged, acquired = false (the engine answers 422:
// the key's first request left effects, or will).
//
// A Journal store also reports takeovers: Acquire and AcquireKeep that
// take over a lapsed in-progress record return acquired = true with rec's
// State [StateInProgress], Token the previous holder's token and LeaseLeft
// minus how long its lease had lapsed (< 0); on any other acquisition rec
// is the zero Record.
//
// Each method is one atomic operation, fenced by the token's lease: a
// holder whose lease lapsed (taken over or not) cannot write the journal.
// core/storetest checks implementations.
type Journal interface {
	// StartStep returns the journal entry of step name in the in-progress
	// record whose live lease token holds: the existing entry unchanged (a
	// copy), or, when there is none, a new entry {Name: name, Token:
	// token}, which it records. From then on the record outlives a lapse
	// of its lease by retain (> 0, else [ErrInvalidDuration]; the largest
	// retain given wins). [ErrNotOwner] when token does not hold a live
	// lease, [ErrTooManySteps] when a new entry would be the journal's
	// [MaxSteps]+1st.
	StartStep(ctx context.Context, key, token, name string, retain time.Duration) (StepEntry, error)

	// FinishStep marks step name done with result (not nil; at most
	// [MaxStepBytes], else [ErrTooLarge]; the store keeps a copy). A done
	// entry is left unchanged and nil returned (a retried call whose reply
	// was lost). [ErrNotOwner] when token does not hold a live lease or the
	// step has no entry.
	FinishStep(ctx context.Context, key, token, name string, result []byte) error

	// Suspend turns the in-progress record whose live lease token holds
	// into an uncertain one ([StateUncertain], Token kept) for keep from
	// now, its journal kept: a step's outcome is unknown, and an operator
	// resolves it ([Keeper.Resolve]). keep must be > 0 ([ErrInvalidDuration]).
	// [ErrNotOwner] when token does not hold a live lease.
	Suspend(ctx context.Context, key, token string, keep time.Duration) error

	// Steps returns the journal of the live record for key, in the order
	// the steps were started (Results copied); nil when the key is absent,
	// expired or a tombstone, or has no steps.
	Steps(ctx context.Context, key string) ([]StepEntry, error)
}

// SuspendUnit is implemented by the [Unit]s of stores that are both
// [Transactional] and [Journal]: Suspend rolls the handler's writes back,
// then does [Journal.Suspend] for the unit's execution (even if the
// rollback failed).
type SuspendUnit interface {
	Unit
	Suspend(ctx context.Context, keep time.Duration) error
}
