package chaos

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

// TestRetryAfterFollowsTheHolder: a 409's Retry-After tells a live holder
// from a dead one, across processes on Redis and PostgreSQL (the stores
// that report the lease's time left). Instance A runs a handler in the
// provider (its lease renewed every lease/3); retries through instance B
// get "Retry-After: 1" for longer than a renewal period. Then A is
// SIGKILLed: B's 409s soon carry the lease's time left (more than 1 s, at
// most lease - lease/3 - 2 × the store timeout, rounded up), and the key
// is not taken over before that time has passed.
func TestRetryAfterFollowsTheHolder(t *testing.T) {
	const (
		lease        = 9 * time.Second
		storeTimeout = time.Second
		dead         = 4 // seconds: lease - lease/3 - 2 × store timeout; less left means no renewal
	)
	for _, tc := range []struct {
		name  string
		flags func(t *testing.T) []string
	}{
		{"redis", func(t *testing.T) []string {
			return []string{"-store", "redis", "-redis-url", "redis://" + startRedis(t).Addr() + "/0"}
		}},
		{"postgres", func(t *testing.T) []string {
			url, schema, _ := pgDatabase(t)
			return []string{"-store", "postgres", "-postgres-url", url, "-postgres-schema", schema}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append(tc.flags(t), "-lease", lease.String(), "-store-timeout", storeTimeout.String())
			a := startService(t, "nethttp", "", append(args, "-charge-latency", "1m")...) // killed in the provider
			b := startService(t, "nethttp", "", append(args, "-charge-latency", "0")...)
			user, key := "u"+hexID(), newKey()

			first := async(a.URL, user, key, 1000)
			a.waitExecutions(1) // in the provider: acquired, renewed every lease/3

			// Alive: the short delay, through more than one renewal period.
			live := retryUntil(b.URL, user, key, 1000, 100*time.Millisecond, lease/3+time.Second, func(answer) bool { return false })
			for _, x := range live {
				if x.status != http.StatusConflict || x.retry != "1" {
					t.Fatalf("while A renews: %v Retry-After %q, want 409 with 1; all: %v", x, x.retry, summary(live))
				}
			}

			a.kill()
			if ans := <-first; ans.err == nil {
				t.Fatalf("the killed instance answered %v", ans)
			}
			// Dead: 409s until the lease lapses, then B executes.
			answers := retryUntil(b.URL, user, key, 1000, 100*time.Millisecond, lease+20*time.Second,
				func(a answer) bool { return a.status != http.StatusConflict })
			won := answers[len(answers)-1]
			if won.status != http.StatusCreated || won.replayed {
				t.Fatalf("retries after the kill ended with %v; all: %v", won, summary(answers))
			}
			var told *answer // the first 409 telling more than the short delay
			var values []string
			for i, x := range answers[:len(answers)-1] {
				n, err := strconv.Atoi(x.retry)
				if err != nil || n < 1 || n > dead {
					t.Fatalf("409 after the kill with Retry-After %q, want 1 to %d", x.retry, dead)
				}
				if n > 1 && told == nil {
					told = &answers[i]
				}
				values = append(values, x.retry)
			}
			if told == nil {
				t.Fatalf("no 409 after the kill told the lease's time left (all Retry-After: %v)", values)
			}
			// The lease had more than Retry-After - 1 s left when told was
			// answered (safety: never earlier, however loaded the machine);
			// the upper bound is generous (liveness: retries are slow on a
			// loaded machine, not wrong).
			n, _ := strconv.Atoi(told.retry)
			if took := won.at.Sub(told.at); took < time.Duration(n-1)*time.Second || took > time.Duration(n)*time.Second+10*time.Second {
				t.Errorf("taken over %v after a 409 said Retry-After: %d", took, n)
			}
			t.Logf("%s: %d 409s while A renewed, all Retry-After 1; after the kill: %v, then B executed %v after the first Retry-After %d",
				tc.name, len(live), values, won.at.Sub(told.at).Round(time.Millisecond), n)
		})
	}
}
