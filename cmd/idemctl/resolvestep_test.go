package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
)

// TestResolveStep is the operator's story of a crash inside a step that is
// not repeatable, on every shared store: a payment charged the card (a
// step), then its process died inside the mail step; the retry takes it
// over and ends it uncertain (the mail's outcome is unknown); `show` prints
// both steps with the charge's result decoded. Resolved done with the
// provider's answer (a JSON file), the next retry resumes: the charge and
// the mail replay (the mail's fn does not run again, the step returns the
// resolved value), and the ledger row after them is written once.
// Resolved not done, the mail step runs once on resume.
func TestResolveStep(t *testing.T) {
	for name, newBackend := range backends {
		t.Run(name, func(t *testing.T) {
			b := newBackend(t)
			t.Run("done", func(t *testing.T) { testResolveStep(t, b, true) })
			t.Run("not done", func(t *testing.T) { testResolveStep(t, b, false) })
		})
	}
}

func testResolveStep(t *testing.T, b testStore, done bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, ok := b.store.(idem.StepResolver); !ok {
		t.Fatalf("%T does not implement idem.StepResolver", b.store)
	}
	// The engine's holders stop renewing (as a crashed process's): one held
	// in the mail step loses its 2s lease.
	var logs lockedBuffer // the takeover after the resolve is reported as a resume
	engine, err := idem.New(adaptertest.CrashableJournal(b.store), idem.WithLease(2*time.Second), idem.WithStoreTimeout(500*time.Millisecond),
		idem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = engine.Close(ctx) }()
	type receipt struct {
		ID string `json:"id"`
	}
	var charges, mails, ledger atomic.Int64
	crash := make(chan struct{}) // holds the first mail step: its process died there
	pay := func(ctx context.Context) (string, error) {
		charge, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
			return fmt.Sprintf("ch_%d", charges.Add(1)), nil
		}, idem.Repeatable())
		if err != nil {
			return "", err
		}
		mail, err := idem.Step(ctx, "mail", func(context.Context) (receipt, error) {
			n := mails.Add(1)
			if n == 1 {
				<-crash
			}
			return receipt{ID: fmt.Sprintf("mail_%d", n)}, nil
		})
		if err != nil {
			return "", err
		}
		ledger.Add(1) // the handler's work after the step
		return charge + "/" + mail.ID, nil
	}
	op := idem.Operation{Scope: "acct_1", Name: "pay", Key: "pay-" + randomHex(8), Payload: []byte(`{"amount":1200}`)}
	scoped := op.RecordKey()

	crashed := make(chan struct{})
	go func() { defer close(crashed); _, _ = idem.Do(ctx, engine, op, pay) }() // its completion is fenced off: not the key's
	defer func() { close(crash); <-crashed }()
	for deadline := time.Now().Add(30 * time.Second); mails.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first run never reached its mail step")
		}
	}
	// The retry waits out the lease, takes over and ends uncertain.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := idem.Do(ctx, engine, op, pay)
		if errors.Is(err, idem.ErrStepUncertain) {
			break
		}
		if !errors.Is(err, idem.ErrInProgress) || time.Now().After(deadline) {
			t.Fatalf("retry after the crash: %v; want in progress until the lease lapses, then ErrStepUncertain", err)
		}
	}
	if _, err := idem.Do(ctx, engine, op, pay); !errors.Is(err, idem.ErrUncertain) {
		t.Fatalf("retry of the uncertain record: %v; want ErrUncertain", err)
	}
	code, out, errOut := ctl(ctx, t, b, "", "show", scoped)
	if code != exitOK || !strings.Contains(out, "state        uncertain") ||
		!strings.Contains(out, `step         charge: done, result "ch_1" (started by`) ||
		!strings.Contains(out, "step         mail: started, not done") {
		t.Fatalf("show = %d\n%s%s", code, out, errOut)
	}
	// The hints lead to resolve-step, not release (which would repeat the
	// mail), and into the runbook.
	for _, want := range []string{"next         step mail started and its outcome is unknown",
		"idemctl resolve-step -step mail -result FILE", "Not release: it deletes the journal", runbookURL + "#uncertain-payment"} {
		if !strings.Contains(out, want) {
			t.Fatalf("show of a step-uncertain record lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "until release or complete") {
		t.Fatalf("show of a step-uncertain record points to release or complete:\n%s", out)
	}
	// The record of an idem.Do operation, named by its fields: -method
	// "(do)" is taken as given (not upper-cased).
	code, named, errOut := ctl(ctx, t, b, "", "show", "-principal", op.Scope, "-method", "(do)", "-route", op.Name, "-key", op.Key)
	if code != exitOK || !strings.Contains(named, "scoped key   "+scoped) || !strings.Contains(named, "state        uncertain") {
		t.Fatalf("show -principal %s -method (do) -route %s -key %s = %d\n%s%s\nwant the record %s", op.Scope, op.Name, op.Key, code, named, errOut, scoped)
	}

	// A refusal and a usage error leave the record as it is.
	if code, out, _ := ctl(ctx, t, b, "n\n", "resolve-step", "-step", "mail", "-not-done", scoped); code != exitFail || !strings.Contains(out, "not resolved") {
		t.Fatalf("resolve-step answered no = %d\n%s", code, out)
	}
	if code, _, errOut := ctl(ctx, t, b, "", "resolve-step", "-step", "mail", "-not-done", "-result", "x.json", scoped); code != exitUsage || !strings.Contains(errOut, "one of -result FILE") {
		t.Fatalf("resolve-step with -result and -not-done = %d\n%s", code, errOut)
	}

	want := "ch_1/mail_2" // not done: the mail step runs again, once
	args := []string{"resolve-step", "-step", "mail", "-not-done"}
	if done {
		want = "ch_1/mail_provider_42" // done: the step returns the provider's answer
		file := filepath.Join(t.TempDir(), "mail.json")
		if err := os.WriteFile(file, []byte(`{"id":"mail_provider_42"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		args = []string{"resolve-step", "-step", "mail", "-result", file}
	}
	code, out, errOut = ctl(ctx, t, b, "y\n", append(args, scoped)...)
	if code != exitOK || !strings.Contains(out, "resolved: step mail") {
		t.Fatalf("resolve-step = %d\n%s%s", code, out, errOut)
	}
	// show after resolve-step: the lease lapsed, the record due; no
	// negative expiry, no crash.
	code, out, errOut = ctl(ctx, t, b, "", "show", scoped)
	if code != exitOK || !strings.Contains(out, "state        in-progress") || !strings.Contains(out, "lease        lapsed") ||
		!strings.Contains(out, ": due (taken over by the next request") || strings.Contains(out, "expires in   -") || strings.Contains(out, "crashed") {
		t.Fatalf("show after resolve-step = %d\n%s%s\nwant the lease lapsed and the record due", code, out, errOut)
	}
	if done && !strings.Contains(out, `step         mail: done, result {"id":"mail_provider_42"}`) {
		t.Fatalf("show after resolve-step = %d\n%s%s", code, out, errOut)
	}
	before := len(logs.String())
	got, err := idem.Do(ctx, engine, op, pay)
	if err != nil || got != want {
		t.Fatalf("retry after resolve-step = %q, %v; want %q", got, err, want)
	}
	if after := logs.String()[before:]; !strings.Contains(after, "resumed a record an operator resolved") || strings.Contains(after, "stopped renewing") {
		t.Fatalf("the takeover after resolve-step logged\n%s\nwant a resume, no crash", after)
	}
	if again, err := idem.Do(ctx, engine, op, pay); err != nil || again != want {
		t.Fatalf("retry after the resumed run = %q, %v; want the replay of %q", again, err, want)
	}
	wantMails := int64(1)
	if !done {
		wantMails = 2
	}
	if charges.Load() != 1 || mails.Load() != wantMails || ledger.Load() != 1 {
		t.Fatalf("charges %d, mail step runs %d, ledger rows %d; want 1, %d, 1", charges.Load(), mails.Load(), ledger.Load(), wantMails)
	}
	if code, out, _ := ctl(ctx, t, b, "", "resolve-step", "-yes", "-step", "mail", "-not-done", scoped); code != exitFail || !strings.Contains(out, "not resolved: the record is not uncertain") {
		t.Fatalf("resolve-step of a completed record = %d\n%s", code, out)
	}
}

// lockedBuffer is a log destination safe for concurrent writers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRecordMethod: -method names the record as the engine keys it: HTTP
// methods upper-cased, idem.Do's "(do)" as given.
func TestRecordMethod(t *testing.T) {
	for in, want := range map[string]string{"post": "POST", "PATCH": "PATCH", "m-search": "M-SEARCH", "(do)": "(do)"} {
		if got := recordMethod(in); got != want {
			t.Errorf("recordMethod(%q) = %q, want %q", in, got, want)
		}
	}
	if idem.ScopedKey("acct_1", recordMethod("(do)"), "pay", "k") != (idem.Operation{Scope: "acct_1", Name: "pay", Key: "k"}).RecordKey() {
		t.Fatal(`-method "(do)" -route pay does not name idem.Do's record of operation pay`)
	}
}
