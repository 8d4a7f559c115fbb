package client

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// Stepper is a broker handler's body for step tests: Run calls
// idem.Step("charge") with the handler's ctx, and its first run then waits
// for Release, as a consumer that stops before settling its message.
type Stepper struct {
	runs      atomic.Int64 // Run calls
	charges   atomic.Int64 // runs of the step's function
	journaled atomic.Int64 // Run calls past idem.Step
	derived   atomic.Pointer[string]
	mu        sync.Mutex
	results   []string // each run's step result
	keys      []string // each run's idem.StepKey
	release   chan struct{}
	once      sync.Once
}

// NewStepper returns a Stepper released at the end of the test.
func NewStepper(t *testing.T) *Stepper {
	s := &Stepper{release: make(chan struct{})}
	t.Cleanup(s.Release)
	return s
}

// Release lets the first run end.
func (s *Stepper) Release() { s.once.Do(func() { close(s.release) }) }

// Run is the handler's work.
func (s *Stepper) Run(ctx context.Context) error {
	n := s.runs.Add(1)
	key, _ := idem.StepKey(ctx, "charge")
	charge, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
		if k, ok := idem.DerivedKey(ctx); ok {
			s.derived.Store(&k)
		}
		return fmt.Sprintf("ch_%d", s.charges.Add(1)), nil
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.results = append(s.results, charge)
	s.keys = append(s.keys, key)
	s.mu.Unlock()
	s.journaled.Add(1)
	if n == 1 {
		select {
		case <-s.release:
		case <-time.After(20 * time.Second):
		}
	}
	return nil
}

// Journaled returns how many runs got past their step.
func (s *Stepper) Journaled() int64 { return s.journaled.Load() }

// WaitJournaled waits (up to 20s) until n runs got past their step.
func (s *Stepper) WaitJournaled(t *testing.T, n int64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); s.journaled.Load() < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d runs got past their step (step runs %d)", s.journaled.Load(), n, s.charges.Load())
		}
	}
}

// CheckTakeover fails the test unless the step's function ran once, in
// the first run, and the two runs past the step (the first, then the
// takeover) got its result ch_1 and the same derived key: "idem-" and 64
// hex characters, the one the function's ctx carried.
func (s *Stepper) CheckTakeover(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	derived := s.derived.Load()
	if derived == nil {
		t.Fatalf("step runs %d, none with a derived key in its ctx", s.charges.Load())
	}
	if s.charges.Load() != 1 || len(*derived) != 69 || !strings.HasPrefix(*derived, "idem-") {
		t.Fatalf("step runs %d, derived key %q; want one run whose ctx carried idem- and 64 hex characters", s.charges.Load(), *derived)
	}
	if len(s.results) != 2 {
		t.Fatalf("runs past the step: %v; want two, the first and the takeover", s.results)
	}
	for i := range s.results {
		if s.results[i] != "ch_1" || s.keys[i] != *derived {
			t.Fatalf("run %d got %q with step key %q; want the journaled ch_1 and the derived key %q", i+1, s.results[i], s.keys[i], *derived)
		}
	}
}
