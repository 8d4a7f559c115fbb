package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
)

// recordingResolver keeps what ResolveStep hands the store.
type recordingResolver struct {
	Store
	key, name string
	result    []byte
	calls     int
}

func (r *recordingResolver) ResolveStep(_ context.Context, key, name string, result []byte) error {
	r.key, r.name, r.result = key, name, result
	r.calls++
	return nil
}

// TestResolveStepEncoding: a result ResolveStep journals is what Step
// decodes as its T (the operator's JSON file for a JSONCodec step), and
// DecodeStep shows it, and Step's own results and permanent errors,
// back; a not-done resolve hands the store nil; names, empty and
// oversized results and stores without the capability are refused before
// the store is asked.
func TestResolveStepEncoding(t *testing.T) {
	ctx := context.Background()
	type charge struct {
		ID     string `json:"id"`
		Amount int    `json:"amount"`
	}
	r := &recordingResolver{}
	file := []byte(`{"id":"ch_9","amount":1200}`)
	if err := ResolveStep(ctx, r, "k", "charge", file, true); err != nil || r.key != "k" || r.name != "charge" {
		t.Fatalf("ResolveStep = %v (key %q, step %q)", err, r.key, r.name)
	}
	v, err := decodeStep[charge](r.result, JSONCodec)
	if err != nil || v != (charge{ID: "ch_9", Amount: 1200}) {
		t.Fatalf("Step would decode the resolved result as %+v, %v", v, err)
	}
	out, err := DecodeStep(StepEntry{Name: "charge", Done: true, Result: r.result})
	if err != nil || !out.Done || !bytes.Equal(out.Value, file) || out.Err != nil {
		t.Fatalf("DecodeStep of the resolved result = %+v, %v; want the file's bytes", out, err)
	}

	if err := ResolveStep(ctx, r, "k", "charge", file, false); err != nil || r.result != nil {
		t.Fatalf("ResolveStep not done = %v, handed %q; want nil", err, r.result)
	}

	enc, _ := encodeStep(charge{ID: "ch_1"}, nil, JSONCodec)
	if out, err := DecodeStep(StepEntry{Name: "charge", Done: true, Result: enc}); err != nil || string(out.Value) != `{"id":"ch_1","amount":0}` {
		t.Fatalf("DecodeStep of a Step value = %+v, %v", out, err)
	}
	enc, _ = encodeStep(0, fmt.Errorf("card declined: %w", ErrPermanent), JSONCodec)
	if out, err := DecodeStep(StepEntry{Name: "charge", Done: true, Result: enc}); err != nil || out.Err == nil || out.Err.Message != "card declined: idem: permanent failure" || out.Value != nil {
		t.Fatalf("DecodeStep of a permanent error = %+v, %v", out, err)
	}
	if out, err := DecodeStep(StepEntry{Name: "charge"}); err != nil || out.Done {
		t.Fatalf("DecodeStep of a started step = %+v, %v", out, err)
	}
	if _, err := DecodeStep(StepEntry{Name: "charge", Done: true, Result: []byte("x1")}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("DecodeStep of a foreign result = %v; want ErrCorrupt", err)
	}

	calls := r.calls
	for name, call := range map[string]func() error{
		"bad name":    func() error { return ResolveStep(ctx, r, "k", "a b", file, true) },
		"empty":       func() error { return ResolveStep(ctx, r, "k", "charge", nil, true) },
		"too large":   func() error { return ResolveStep(ctx, r, "k", "charge", make([]byte, MaxStepBytes), true) },
		"no capacity": func() error { return ResolveStep(ctx, newScriptStore(0), "k", "charge", file, true) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: ResolveStep = nil, want an error", name)
		}
	}
	if r.calls != calls {
		t.Fatalf("the store was asked %d times for refused resolves", r.calls-calls)
	}
	if err := ResolveStep(ctx, r, "k", "charge", make([]byte, MaxStepBytes), true); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized = %v, want ErrTooLarge", err)
	}
	if err := ResolveStep(ctx, newScriptStore(0), "k", "charge", file, true); !errors.Is(err, ErrNoStepResolver) {
		t.Fatalf("no capability = %v, want ErrNoStepResolver", err)
	}
}
