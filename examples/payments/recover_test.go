package main

import (
	"crypto/rand"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// recoverFlags run an instance with recovery and a recoverer every 300ms.
var recoverFlags = []string{"-recover", "-recover-every", "300ms"}

// TestRecoverWithoutClient SIGKILLs the payments service (-provider-url,
// lease 2s; on FerretDB 8s with 2s store calls, in a collection of its
// own) mid-payment and restarts it, on every shared store, and no
// client retries: with -recover the restarted instance's recoverer
// finishes the payment on its own (a crash after the charge: one charge,
// one receipt, one ledger row on the SQL stores, and the client's late
// retry gets the payment replayed) or parks it uncertain (a crash inside
// the receipt step: one charge, no row, the late retry gets 409
// operation-uncertain). The control, without -recover, leaves the
// payment incomplete (no row) until the client's retry takes it over and
// runs it (not a replay).
func TestRecoverWithoutClient(t *testing.T) {
	bin, provider := buildCrashBinaries(t)
	var wg sync.WaitGroup // all stores at once: each mostly waits for a lease to lapse
	for _, store := range []string{"redis", "mongo", "postgres", "mysql"} {
		wg.Go(func() {
			t.Run(store, func(t *testing.T) {
				env := newCrashEnv(t, store, bin, provider)
				for _, c := range []struct {
					point   string
					recover bool
					want    crashOutcome
				}{
					{"charge-after-call", true, crashOutcome{http.StatusCreated, 1, 1}},
					{"receipt-before-call", true, crashOutcome{http.StatusConflict, 1, 0}},
					{"charge-after-call", false, crashOutcome{http.StatusCreated, 1, 1}},
				} {
					got, rows, replayed := env.crashUnattended(t, c.point, c.recover)
					if got != c.want || replayed != (c.recover && c.want.status == http.StatusCreated) {
						t.Errorf("%s, recover %v: %+v, replayed %v; want %+v, replayed %v", c.point, c.recover, got, replayed, c.want, c.recover && c.want.status == http.StatusCreated)
					}
					if env.rows != nil && rows != c.want.charges*boolInt(c.want.status == http.StatusCreated) {
						t.Errorf("%s, recover %v: %d ledger rows", c.point, c.recover, rows)
					}
				}
			})
		})
	}
	wg.Wait()
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// crashUnattended sends one payment to an instance held at point,
// SIGKILLs it there and restarts the service (with recovery or not), with
// no client retry: with recovery it waits for the recoverer's answer
// (its metrics count a recovered or an uncertain execution); without,
// for two leases, and checks the ledger has no row. Then the client's late
// retry gets the final answer. It returns that answer, the provider's new
// charges and receipts, the ledger rows, and whether the late retry was a
// replay.
func (env *crashEnv) crashUnattended(t *testing.T, point string, recover bool) (crashOutcome, int64, bool) {
	t.Helper()
	var extra []string
	if recover {
		extra = recoverFlags
	}
	if slices.Contains(env.args, "mongo") { // a collection of its own (no other test's records to recover), and FerretDB's slower calls
		extra = append(slices.Clip(extra), "-mongo-collection", "recover_"+strings.ToLower(rand.Text()[:10]), "-store-timeout", "2s", "-lease", "8s")
	}
	before := env.stats(t)
	user, key := "unattended-"+rand.Text()[:8], rand.Text()
	a := env.start(t, append([]string{"-pause-at", point}, extra...)...)
	sent := make(chan struct{})
	go func() { defer close(sent); _, _, _ = send(a.URL, user, key, amount) }() // cut by the SIGKILL
	if _, err := a.Line("paused at " + point); err != nil {
		t.Fatalf("%s: %v", point, err)
	}
	a.Kill()
	<-sent
	b := env.start(t, extra...)
	defer b.Stop()
	if recover {
		for deadline := time.Now().Add(60 * time.Second); !metricSeen(t, b.URL, `idem_outcome="recovered"`) && !metricSeen(t, b.URL, `idem_outcome="uncertain"`); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the recoverer finished nothing in 60s", point)
			}
		}
	} else {
		time.Sleep(4 * time.Second) // two leases: nothing happens without a client
		if metricSeen(t, b.URL, `idem_outcome="recovered"`) {
			t.Fatalf("%s: recovered without -recover", point)
		}
	}
	if env.rows != nil && !recover {
		if n := env.rows(t, user); n != 0 {
			t.Fatalf("%s without -recover: %d ledger rows before the client came back, want 0", point, n)
		}
	}
	status, h, body := send(b.URL, user, key, amount)
	if status == http.StatusConflict && h.Get("Retry-After") != "" { // without -recover: the lapsed lease is taken over by a retry
		status, body = retry(t, b.URL, user, key, amount)
		h = http.Header{}
	}
	if status == http.StatusConflict && !strings.Contains(string(body), "operation-uncertain") {
		t.Errorf("%s: 409 %s, want operation-uncertain", point, body)
	}
	after := env.stats(t)
	var rows int64
	if env.rows != nil {
		rows = env.rows(t, user)
	}
	return crashOutcome{status, after.Charges - before.Charges, after.Emails - before.Emails}, rows, h.Get(idem.ReplayedHeader) == "true"
}

// metricSeen reports whether the instance's GET /metrics has a line
// containing s.
func metricSeen(t *testing.T, base, s string) bool {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), s)
}
