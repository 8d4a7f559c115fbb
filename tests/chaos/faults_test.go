package chaos

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	tpclient "github.com/Shopify/toxiproxy/v2/client"
)

// seq run-length encodes answers: "503 409×12 201".
func seq(as []answer) string {
	var parts []string
	for i := 0; i < len(as); {
		j := i
		for j < len(as) && as[j].String() == as[i].String() {
			j++
		}
		if j-i > 1 {
			parts = append(parts, fmt.Sprintf("%s×%d", as[i], j-i))
		} else {
			parts = append(parts, as[i].String())
		}
		i = j
	}
	return strings.Join(parts, " ")
}

// settle retries a request every 50ms until it is answered with neither 409
// nor 503, for at most limit.
func settle(url, user, key string, amount int, limit time.Duration) []answer {
	return retryUntil(url, user, key, amount, 50*time.Millisecond, limit, func(a answer) bool {
		return a.err == nil && a.status != http.StatusConflict && a.status != http.StatusServiceUnavailable
	})
}

// fault is one way of breaking the connection to the store.
type fault struct {
	name   string
	kind   string // toxiproxy toxic type
	stream string // upstream: requests to the store; downstream: its replies
	attrs  tpclient.Attributes
}

// Store latency above the store timeout, on the way in or on the way out,
// and a black hole that drops every request.
var slowFaults = []fault{
	// requests reach the store a second late: the operation is applied after
	// the caller gave up
	{"latency-in", "latency", "upstream", tpclient.Attributes{"latency": 1000}},
	// the operation is applied at once, its reply arrives a second late
	{"latency-out", "latency", "downstream", tpclient.Attributes{"latency": 1000}},
	// requests never reach the store (the connection stays open)
	{"blackhole-in", "timeout", "upstream", tpclient.Attributes{"timeout": 0}},
}

const (
	slowLease        = 1500 * time.Millisecond
	slowStoreTimeout = 300 * time.Millisecond
)

// slowService is one instance behind a fresh proxy to a fresh Redis, with a
// store timeout well below the injected latency.
func slowService(t *testing.T, latency string) (*service, *proxy, backend) {
	be := redisBackend(t)
	px := newProxy(t, be.addr)
	a := startService(t, "nethttp", "", append(be.flags(px.Addr()), "-charge-latency", latency,
		"-lease", slowLease.String(), "-store-timeout", slowStoreTimeout.String())...)
	// Warm up: a pooled connection exists when the fault starts, as in production.
	if w := pay(a.URL, "warm", newKey(), 1); w.status != http.StatusCreated {
		t.Fatalf("warm-up: %v", w)
	}
	return a, px, be
}

// TestSlowStore injects each fault on exactly one store operation of a
// request (acquire, complete or release: the fault is added while the
// handler sleeps in the provider for the last two) and records what the
// client and a retry see. Nothing is executed twice, except where a
// completion is lost: then the key stays in progress until its lease lapses
// and the retry executes again. That double execution is asserted here
// because it happens; see the report in the package's README.
func TestSlowStore(t *testing.T) {
	for _, f := range slowFaults {
		t.Run("acquire/"+f.name, func(t *testing.T) {
			t.Parallel()
			a, px, be := slowService(t, "300ms")
			user, key := "u"+hexID(), newKey()
			remove := px.toxic(f.kind, f.stream, f.attrs)
			first := pay(a.URL, user, key, 1000)
			remove()
			if first.status != http.StatusServiceUnavailable {
				t.Fatalf("slow acquire: %v, want 503", first)
			}
			if first.took > slowStoreTimeout+10*time.Second { // bounded by the store timeout, not the fault; slack for a loaded machine
				t.Errorf("slow acquire answered after %v; store timeout %v", first.took, slowStoreTimeout)
			}
			retries := settle(a.URL, user, key, 1000, slowLease+15*time.Second)
			last := retries[len(retries)-1]
			if last.status != http.StatusCreated || last.replayed {
				t.Fatalf("retry after a slow acquire: %s, want 201 executed", seq(retries))
			}
			for _, r := range retries[:len(retries)-1] {
				// 409: the late acquire took the key for an owner that is gone
				if r.status != http.StatusConflict && r.status != http.StatusServiceUnavailable {
					t.Errorf("retry after a slow acquire: %s", seq(retries))
				}
			}
			if w := last.at.Sub(first.at); w > slowLease+5*time.Second { // the lease itself frees it; the slack is for a loaded machine
				t.Errorf("key stuck %v after a slow acquire, lease %v", w, slowLease)
			}
			if n := a.executions(); n != 2 {
				t.Errorf("executions %d, want 2 (warm-up and the retry)", n)
			}
			t.Logf("slow acquire (%s): client 503 after %v; retry sees %s (executed %v after the first attempt); executions of this key 1",
				f.name, first.took.Round(time.Millisecond), seq(retries), last.at.Sub(first.at).Round(time.Millisecond))
			checkSettled(t, a, be)
		})
		t.Run("complete/"+f.name, func(t *testing.T) {
			t.Parallel()
			a, px, be := slowService(t, "800ms")
			user, key := "u"+hexID(), newKey()
			firstc := async(a.URL, user, key, 1000)
			a.waitExecutions(2)
			remove := px.toxic(f.kind, f.stream, f.attrs)
			first := <-firstc
			remove()
			if first.status != http.StatusCreated || first.replayed {
				t.Fatalf("slow complete: client got %v, want its 201 (store errors never change it)", first)
			}
			retries := settle(a.URL, user, key, 1000, slowLease+15*time.Second)
			last := retries[len(retries)-1]
			n := a.executions()
			t.Logf("slow complete (%s): client 201 after %v; retry sees %s; executions %d; log: %s",
				f.name, first.took.Round(time.Millisecond), seq(retries), n, lastLines(a.logs(), 2))
			for _, r := range retries[:len(retries)-1] {
				if r.status != http.StatusConflict {
					t.Errorf("retry after a slow complete: %s, want 409s until the background completion lands", seq(retries))
				}
			}
			// The engine keeps renewing the lease and retries the completion
			// in the background (idem.WithCompletionRetry), so a store fault
			// shorter than the lease never lets a retry execute again.
			if last.status != http.StatusCreated || !last.replayed || last.id != first.id {
				t.Errorf("DOUBLE EXECUTION after a slow complete (%s): retry ended with %s; executions %d", f.name, seq(retries), n)
			}
			if n != 2 {
				t.Errorf("executions %d, want 2 (the warm-up and one)", n)
			}
			checkSettled(t, a, be)
		})
		t.Run("release/"+f.name, func(t *testing.T) {
			t.Parallel()
			a, px, be := slowService(t, "800ms")
			user, key := "u"+hexID(), newKey()
			firstc := async(a.URL, user, key, 5000) // provider error: 502, the key is released
			a.waitExecutions(2)
			remove := px.toxic(f.kind, f.stream, f.attrs)
			first := <-firstc
			remove()
			if first.status != http.StatusBadGateway {
				t.Fatalf("slow release: client got %v, want 502", first)
			}
			retries := settle(a.URL, user, key, 5000, slowLease+15*time.Second)
			last := retries[len(retries)-1]
			if last.status != http.StatusBadGateway || last.replayed {
				t.Fatalf("retry after a slow release: %s, want 502 executed again (5xx is not stored)", seq(retries))
			}
			for _, r := range retries[:len(retries)-1] {
				if r.status != http.StatusConflict {
					t.Errorf("retry after a slow release: %s, want 409s then 502", seq(retries))
				}
			}
			if w := last.at.Sub(first.at.Add(first.took)); w > slowLease+5*time.Second { // the lease itself frees it; the slack is for a loaded machine
				t.Errorf("key stuck %v after a failed release, lease %v", w, slowLease)
			}
			if n := a.executions(); n != 3 {
				t.Errorf("executions %d, want 3 (warm-up, and a 5xx executes again)", n)
			}
			t.Logf("slow release (%s): client 502 after %v; retry sees %s; executions of this key 2 (allowed: 5xx)",
				f.name, first.took.Round(time.Millisecond), seq(retries))
			checkSettled(t, a, be)
		})
	}
}

// checkSettled waits one lease and checks that no record is left in
// progress, then stops the service.
func checkSettled(t *testing.T, a *service, be backend) {
	t.Helper()
	time.Sleep(slowLease)
	if stuck, _ := be.inProgress(t); stuck != 0 {
		t.Errorf("%d records in progress one lease after the end", stuck)
	}
	a.stop()
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
