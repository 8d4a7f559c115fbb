package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// kindLog records the kinds of an engine's events.
type kindLog struct {
	mu    sync.Mutex
	kinds []idem.EventKind
}

func (l *kindLog) hook(_ context.Context, ev idem.Event) {
	l.mu.Lock()
	l.kinds = append(l.kinds, ev.Kind)
	l.mu.Unlock()
}

// since returns the kinds recorded from the n-th on, and how many there are.
func (l *kindLog) since(n int) ([]idem.EventKind, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.kinds[n:]), len(l.kinds)
}

// testStepFailKeepsJournal: a [idem.Do] function that fails without an
// answer to store after a step finished (a transient error, e.g. the
// store down when the next step starts) does not release the key: the
// journal is kept, the lease lapses at once ([idem.EventAbandoned]), and
// the retry takes it over and replays the finished step without running
// it (the charge is never sent twice). A function that fails before any
// step finished (no step, or one whose fn returned a transient error: no
// effect) releases the key as before: the retry runs afresh, with no
// takeover and no uncertain step.
func testStepFailKeepsJournal(t *testing.T, s idem.Store) {
	var log kindLog
	e := doEngine(t, s, idem.WithLease(longLease), idem.WithStoreTimeout(10*time.Second), idem.WithEventHook(log.hook))
	j := journal(t, s)
	var charges atomic.Int32
	chargeStep := func(ctx context.Context) (charge, error) {
		return idem.Step(ctx, "charge", func(context.Context) (charge, error) {
			return charge{ID: fmt.Sprintf("ch_%d", charges.Add(1))}, nil
		})
	}
	down := errors.New("storetest: the next step's store call failed")
	// retry runs op until it is no longer in progress: the abandoned
	// lease lapses at once where the store can shorten it, else at its term.
	retry := func(op idem.Operation, fn func(context.Context) (charge, error)) (charge, error) {
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			got, err := idem.Do(ctx(t), e, op, fn)
			if !errors.Is(err, idem.ErrInProgress) || time.Now().After(deadline) {
				return got, err
			}
		}
	}

	op := doOp("p1")
	_, err := idem.Do(ctx(t), e, op, func(ctx context.Context) (charge, error) {
		if _, err := chargeStep(ctx); err != nil {
			return charge{}, err
		}
		return charge{}, down
	})
	if !errors.Is(err, down) {
		t.Fatalf("Do whose function failed after a step = %v; want its error", err)
	}
	kinds, seen := log.since(0)
	if slices.Contains(kinds, idem.EventReleased) || !slices.Contains(kinds, idem.EventAbandoned) {
		t.Fatalf("events %v; want the execution abandoned with its journal, not released", kinds)
	}
	scoped := idem.ScopedKey(op.Scope, "(do)", op.Name, op.Key)
	if st := steps(t, j, scoped); len(st) != 1 || st[0].Name != "charge" || !st[0].Done {
		t.Fatalf("journal after the function failed = %+v; want the charge kept, done", st)
	}
	got, err := retry(op, chargeStep)
	if err != nil || got.ID != "ch_1" || charges.Load() != 1 {
		t.Fatalf("retry = %+v, %v after %d charges; want the journaled ch_1, one charge", got, err, charges.Load())
	}
	if kinds, _ := log.since(seen); !slices.Contains(kinds, idem.EventTakeover) {
		t.Fatalf("retry's events %v; want a takeover of the abandoned record", kinds)
	}

	// No step finished: released, the retry executes afresh.
	for _, stepFirst := range []bool{false, true} {
		op := doOp("p1")
		runs := 0
		_, err := idem.Do(ctx(t), e, op, func(ctx context.Context) (charge, error) {
			if !stepFirst {
				return charge{}, down
			}
			return idem.Step(ctx, "charge", func(context.Context) (charge, error) {
				runs++
				return charge{}, down // transient: no effect, the step stays started
			})
		})
		if !errors.Is(err, down) {
			t.Fatalf("step first %v: Do = %v; want the function's error", stepFirst, err)
		}
		kinds, n := log.since(seen)
		seen = n
		if !slices.Contains(kinds, idem.EventReleased) || slices.Contains(kinds, idem.EventAbandoned) {
			t.Fatalf("step first %v: events %v; want the key released", stepFirst, kinds)
		}
		got, err := retry(op, chargeStep)
		if err != nil || (stepFirst && runs != 1) {
			t.Fatalf("step first %v: retry = %+v, %v; want the step run afresh", stepFirst, got, err)
		}
		kinds, seen = log.since(seen)
		if slices.Contains(kinds, idem.EventTakeover) {
			t.Fatalf("step first %v: retry's events %v; want a fresh acquire, no takeover", stepFirst, kinds)
		}
	}
}
