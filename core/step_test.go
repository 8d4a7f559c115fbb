package idem

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestStepWithoutJournal: in an execution whose store has no idem.Journal,
// Step refuses with ErrNoJournal and fn never runs; outside an execution
// Step runs fn as it is, with no derived key.
func TestStepWithoutJournal(t *testing.T) {
	e := newDoEngine(t, newScriptStore(0))
	ran := 0
	fn := func(ctx context.Context) (int, error) {
		ran++
		if _, ok := DerivedKey(ctx); ok {
			t.Error("a derived key outside an execution's journal")
		}
		return 7, nil
	}
	_, err := Do(context.Background(), e, Operation{Name: "op", Key: "k"}, func(ctx context.Context) (int, error) {
		return Step(ctx, "charge", fn)
	})
	if !errors.Is(err, ErrNoJournal) || ran != 0 {
		t.Fatalf("Step on a store without a journal = %v after %d runs; want ErrNoJournal, no run", err, ran)
	}
	if v, err := Step(context.Background(), "charge", fn); err != nil || v != 7 || ran != 1 {
		t.Fatalf("Step outside an execution = %d, %v after %d runs; want fn's 7, one run", v, err, ran)
	}
	if _, ok := StepKey(context.Background(), "charge"); ok {
		t.Fatal("StepKey outside an execution: ok")
	}
}

// TestStepNames: names outside [A-Za-z0-9_:/-] or longer than MaxStepName
// are refused before anything runs.
func TestStepNames(t *testing.T) {
	for _, name := range []string{"", "a.b", "a b", "é", "$x", strings.Repeat("a", MaxStepName+1)} {
		ran := false
		_, err := Step(context.Background(), name, func(context.Context) (int, error) { ran = true; return 0, nil })
		if !errors.Is(err, ErrStepName) || ran {
			t.Errorf("Step(%q) = %v, ran %v; want ErrStepName", name, err, ran)
		}
	}
	for _, name := range []string{"charge", "send-receipt", "ledger_v2", "provider:stripe/charge", strings.Repeat("a", MaxStepName)} {
		if _, err := Step(context.Background(), name, func(context.Context) (int, error) { return 0, nil }); err != nil {
			t.Errorf("Step(%q) = %v; want it run", name, err)
		}
	}
}
