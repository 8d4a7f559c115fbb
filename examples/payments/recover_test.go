package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/payments"
	"github.com/idemkit/idem/examples/internal/procs"
)

var soak = flag.Bool("soak", false, "play the long runs: TestRecoverWithoutClients with 500 payments per store (make soak)")

// recoverEvery is the recoverers' interval in these tests (-recover-every).
const recoverEvery = 250 * time.Millisecond

// recoverWait bounds how long the tests wait for recoverers to finish what
// crashed: far beyond lease + interval + handler time, for a loaded machine.
const recoverWait = 3 * time.Minute

// inflight is one payment sent to an instance that was then SIGKILLed.
type inflight struct {
	user, key string
	amount    int64
	point     string // the pause point the instance was killed at
}

// scopedKey is the payment's record key in the store.
func (p inflight) scopedKey() string { return idem.ScopedKey(p.user, "POST", "/v1/payments", p.key) }

// TestRecoverWithoutClients runs, on every shared store (Redis, MongoDB
// wire, PostgreSQL, MySQL), 50 payments (500 with -soak) across two
// instances held at every pause point (each instance cycles through
// payments.PausePoints in its own order), SIGKILLs both and restarts one,
// and sends no retry: with -recover the recoverer finishes every payment
// (the provider charged once each, one ledger row each, a receipt once,
// or the record parked uncertain where the crash cut the receipt step),
// and each client's late retry then gets the stored answer replayed. The
// control, the same crash without -recover, leaves every payment in
// progress after the lease and many recovery intervals.
func TestRecoverWithoutClients(t *testing.T) {
	n := 50
	if *soak {
		n = 500
	}
	bin, provider := buildCrashBinaries(t)
	var wg sync.WaitGroup
	for _, store := range []string{"redis", "mongo", "postgres", "mysql"} {
		wg.Go(func() {
			t.Run(store, func(t *testing.T) {
				env := newCrashEnv(t, store, bin, provider)
				st, closeStore, err := payments.OpenStore(env.cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer closeStore()
				in := st.(idem.Inspector)
				env.recoverWave(t, in, n)
				env.controlWave(t, in, 14)
			})
		})
	}
	wg.Wait()
}

// recoverFlags are the flags of an instance with a recoverer.
var recoverFlags = []string{"-recover", "-recover-every", recoverEvery.String()}

// crashWave sends n payments across two instances started with extra
// flags, each holding its payments at the pause points (A in
// payments.PausePoints's order, B in another), SIGKILLs both once every
// payment is held, and returns the payments.
func (env *crashEnv) crashWave(t *testing.T, n int, extra []string) []inflight {
	t.Helper()
	rotated := append(slices.Clone(payments.PausePoints[3:]), payments.PausePoints[:3]...)
	a := env.start(t, append(slices.Clone(extra), "-pause-at", strings.Join(payments.PausePoints, ","))...)
	b := env.start(t, append(slices.Clone(extra), "-pause-at", strings.Join(rotated, ","))...)
	run := "rec-" + strings.ToLower(rand.Text()[:8])
	sent := make([]inflight, n)
	var wg sync.WaitGroup
	for i := range sent {
		sent[i] = inflight{user: fmt.Sprintf("%s-%d", run, i), key: rand.Text(), amount: int64(1000 + i)}
		p := a
		if i%2 == 1 {
			p = b
		}
		wg.Go(func() { _, _, _ = send(p.URL, sent[i].user, sent[i].key, sent[i].amount) }) // cut by the SIGKILL: no retry
	}
	points := map[string]string{} // user -> point
	for _, p := range []struct {
		proc *procs.Proc
		n    int
	}{{a, (n + 1) / 2}, {b, n / 2}} {
		for range p.n {
			l, err := p.proc.Line("paused at ")
			if err != nil {
				t.Fatal(err)
			}
			var point, user string
			if _, err := fmt.Sscanf(l, "paused at %s %s", &point, &user); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			points[user] = point
		}
	}
	a.Kill()
	b.Kill()
	wg.Wait()
	for i := range sent {
		sent[i].point = points[sent[i].user]
		if sent[i].point == "" {
			t.Fatalf("payment of %s was not held at a point", sent[i].user)
		}
	}
	return sent
}

// recoverWave is TestRecoverWithoutClients on env with n payments.
func (env *crashEnv) recoverWave(t *testing.T, in idem.Inspector, n int) {
	before := env.stats(t)
	sent := env.crashWave(t, n, recoverFlags)
	c := env.start(t, recoverFlags...) // one instance restarted; no client comes back
	defer c.Stop()
	states := waitStates(t, in, sent, recoverWait)
	wantEmails := int64(0)
	for _, p := range sent {
		want := crashOutcomes[p.point]
		wantEmails += want.emails
		wantState := idem.StateCompleted
		if want.status == http.StatusConflict {
			wantState = idem.StateUncertain
		}
		if states[p.key] != wantState {
			t.Errorf("%s cut at %s: %v, want %v", p.user, p.point, states[p.key], wantState)
		}
		if env.rows != nil {
			wantRows := int64(0)
			if wantState == idem.StateCompleted {
				wantRows = 1
			}
			if rows := env.rows(t, p.user); rows != wantRows {
				t.Errorf("%s cut at %s: %d ledger rows, want %d", p.user, p.point, rows, wantRows)
			}
		}
	}
	after := env.stats(t)
	if got := after.Charges - before.Charges; got != int64(n) {
		t.Errorf("provider: %d charges, want %d (one per payment)", got, n)
	}
	if got := after.Emails - before.Emails; got != wantEmails {
		t.Errorf("provider: %d receipts, want %d (one per payment but where the crash came before the mail)", got, wantEmails)
	}
	for _, p := range sent { // the clients' late retries
		status, h, body := send(c.URL, p.user, p.key, p.amount)
		switch want := crashOutcomes[p.point].status; {
		case want == http.StatusCreated && (status != want || h.Get(idem.ReplayedHeader) != "true"):
			t.Errorf("%s cut at %s: the late retry got %d %s (replayed %q), want the payment replayed", p.user, p.point, status, body, h.Get(idem.ReplayedHeader))
		case want == http.StatusConflict && (status != want || !strings.Contains(string(body), "operation-uncertain")):
			t.Errorf("%s cut at %s: the late retry got %d %s, want 409 operation-uncertain", p.user, p.point, status, body)
		}
	}
}

// controlWave crashes n payments as recoverWave does, without -recover:
// after the lease and 20 recovery intervals no payment has completed.
func (env *crashEnv) controlWave(t *testing.T, in idem.Inspector, n int) {
	sent := env.crashWave(t, n, nil)
	c := env.start(t)
	defer c.Stop()
	time.Sleep(2*time.Second + 20*recoverEvery) // -lease 2s
	for _, p := range sent {
		info, found, err := in.Inspect(context.Background(), p.scopedKey())
		if err != nil {
			t.Fatal(err)
		}
		if found && info.State != idem.StateInProgress {
			t.Errorf("control: %s cut at %s is %v without a recoverer or a client, want in progress", p.user, p.point, info.State)
		}
	}
}

// waitStates polls the records of sent until none is in progress, for at
// most limit, and returns each one's state by idempotency key.
func waitStates(t *testing.T, in idem.Inspector, sent []inflight, limit time.Duration) map[string]idem.State {
	t.Helper()
	deadline := time.Now().Add(limit)
	states := map[string]idem.State{}
	for {
		pending := 0
		for _, p := range sent {
			if s := states[p.key]; s == idem.StateCompleted || s == idem.StateUncertain {
				continue
			}
			info, found, err := in.Inspect(context.Background(), p.scopedKey())
			if err != nil {
				t.Fatal(err)
			}
			if !found {
				t.Fatalf("%s cut at %s: no record", p.user, p.point)
			}
			states[p.key] = info.State
			if info.State == idem.StateInProgress {
				pending++
			}
		}
		if pending == 0 {
			return states
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d payments still in progress after %v", pending, len(sent), limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
