package main

import (
	"strings"
	"testing"
)

// The example charges once: the agent's timed-out attempt is retried with
// the same key and gets the stored receipt, and the key reused with another
// amount is refused.
func TestRun(t *testing.T) {
	var out strings.Builder
	if err := run(&out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"context deadline exceeded; again in", "(replayed: true)", "refused, idempotency_key_conflict", "charged once"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
