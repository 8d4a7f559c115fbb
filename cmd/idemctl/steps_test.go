package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// TestShowSteps: show lists a record's step journal on every store, a
// finished step with its result decoded and one started and not finished
// (the one whose outcome is unknown after a crash), each with its starter.
func TestShowSteps(t *testing.T) {
	for name, newBackend := range backends {
		t.Run(name, func(t *testing.T) {
			b := newBackend(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			j, ok := b.store.(idem.Journal)
			if !ok {
				t.Fatalf("%T does not implement idem.Journal", b.store)
			}
			scoped := idem.ScopedKey("acct_1", "POST", "/v1/payments", "pay-steps")
			tok := "web-3:4242:K7QXR2MZLJ2XW5RV.18"
			if _, ok, err := b.store.Acquire(ctx, scoped, tok, "fp", time.Minute); err != nil || !ok {
				t.Fatalf("Acquire = %v, %v", ok, err)
			}
			if _, err := j.StartStep(ctx, scoped, tok, "charge", time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := j.FinishStep(ctx, scoped, tok, "charge", []byte(`v{"id":"ch_1"}`)); err != nil {
				t.Fatal(err)
			}
			if _, err := j.StartStep(ctx, scoped, tok, "receipt", time.Hour); err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			args := append(append([]string{"show"}, b.args...), "-scoped-key", scoped)
			if code := run(ctx, args, strings.NewReader(""), &out, &errOut); code != exitOK {
				t.Fatalf("show = %d\n%s\n%s", code, out.String(), errOut.String())
			}
			for _, want := range []string{
				`step         charge: done, result {"id":"ch_1"} (started by host web-3, pid 4242`,
				"step         receipt: started, not done: its outcome is unknown if its holder stopped (started by host web-3, pid 4242",
			} {
				if !strings.Contains(out.String(), want) {
					t.Fatalf("show:\n%s\nwant %q", out.String(), want)
				}
			}
			if strings.Index(out.String(), "step         charge") > strings.Index(out.String(), "step         receipt") {
				t.Fatalf("show lists the steps out of order:\n%s", out.String())
			}
		})
	}
}
