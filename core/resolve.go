package idem

import (
	"context"
	"errors"
	"fmt"
)

// ErrNoStepResolver is returned by [ResolveStep] for a store that does not
// implement [StepResolver].
var ErrNoStepResolver = errors.New("idem: ResolveStep needs a store that implements idem.StepResolver")

// ResolveStep settles step of the record for key (the scoped key, 64 hex
// characters: [ScopedKey], [Operation.RecordKey]) whose outcome is unknown
// (its holder stopped inside a step that is not [Repeatable], so the record
// is uncertain, or in progress with its lease lapsed), for operators' tools
// (cmd/idemctl resolve-step), so that the handler resumes after it instead
// of the whole record being resolved ([Keeper.Resolve]).
//
// With done, the step happened and result is its value as the step's codec
// encodes it (for the default [JSONCodec], the JSON of the value, e.g. a
// file holding {"id":"ch_1"}): [Step] returns it decoded as its T on the
// handler's next run, without running fn. result is validated against
// nothing but its size: not empty (JSON null stands for a zero value) and,
// encoded, at most [MaxStepBytes] ([ErrTooLarge] otherwise). Without done,
// the step did not happen: its entry is removed and it runs when the
// handler resumes (result is ignored).
//
// Either way the record becomes (or stays) in progress with its lease
// lapsed, its journal otherwise kept, so that the next retry with the same
// request, or a recoverer, takes it over and resumes the handler
// ([StepResolver.ResolveStep], one atomic operation). It returns
// [ErrStepName] for an invalid step name, [ErrNoStepResolver] for a store
// without the capability, and [ErrRecordChanged] when the record is not in
// that state (absent, completed, its lease live, no such step, or the step
// done).
func ResolveStep(ctx context.Context, store Store, key, step string, result []byte, done bool) error {
	if !validStepName(step) {
		return fmt.Errorf("%w: %q", ErrStepName, step)
	}
	r, ok := store.(StepResolver)
	if !ok {
		return fmt.Errorf("%w (%T does not)", ErrNoStepResolver, store)
	}
	if !done {
		return r.ResolveStep(ctx, key, step, nil)
	}
	if len(result) == 0 {
		return errors.New("idem: ResolveStep: a done step needs its result's encoding (JSON null for a zero value)")
	}
	if len(result)+1 > MaxStepBytes {
		return fmt.Errorf("%w: a step result of %d bytes, encoded %d, is over MaxStepBytes (%d)", ErrTooLarge, len(result), len(result)+1, MaxStepBytes)
	}
	return r.ResolveStep(ctx, key, step, append([]byte{stepValue}, result...))
}

// StepOutcome is a journaled step's outcome, decoded by [DecodeStep].
type StepOutcome struct {
	// Done is false for a step started and not done (its outcome is
	// unknown if its holder stopped); Value and Err are then nil.
	Done bool
	// Value is the step's value as its codec encoded it (the JSON of the
	// value for the default [JSONCodec]); nil when Err is set.
	Value []byte
	// Err is the step's [Permanent] error, as [Step] returns it again;
	// nil for a value.
	Err *StoredError
}

// DecodeStep decodes the outcome of a journal entry ([Journal.Steps]) as
// [Step] journaled it (or [ResolveStep] did), for operators' tools: the
// value's encoding or the permanent error. An entry whose result is not
// in that form returns an error wrapping [ErrCorrupt].
func DecodeStep(entry StepEntry) (StepOutcome, error) {
	if !entry.Done {
		return StepOutcome{}, nil
	}
	b := entry.Result
	switch {
	case len(b) > 0 && b[0] == stepValue:
		return StepOutcome{Done: true, Value: b[1:]}, nil
	case len(b) > 0 && b[0] == stepError:
		return StepOutcome{Done: true, Err: &StoredError{Message: string(b[1:])}}, nil
	}
	return StepOutcome{Done: true}, fmt.Errorf("%w: journaled result of step %q", ErrCorrupt, entry.Name)
}
