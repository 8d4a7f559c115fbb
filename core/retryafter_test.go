package idem

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// storeOnly hides every capability of a Store but the Store methods.
type storeOnly struct{ Store }

// TestConflictRetryAfter: a 409's Retry-After is the short delay while the
// holder's lease looks renewed (or the store does not tell), and the time
// left on the lease, within [short delay, lease], once the holder has
// stopped renewing for longer than a renewal period and 2 store timeouts.
func TestConflictRetryAfter(t *testing.T) {
	ctx := context.Background()
	quiet := WithLogger(slog.New(slog.DiscardHandler))
	retryAfter := func(e *Engine, route string) string {
		t.Helper()
		x, resp := e.Begin(ctx, postTo(route, "k"))
		if x != nil || resp.Status != http.StatusConflict {
			t.Fatalf("%s: want 409", route)
		}
		return resp.Header.Get("Retry-After")
	}
	// lease 30s, store timeout 2s: a renewing holder has more than 30-10-4 = 16s left.
	store := newClockStore()
	store.leaseLeft = true
	e, err := New(store, WithLease(30*time.Second), WithRoute("POST", "/long", RouteLease(2*time.Minute)), quiet)
	if err != nil {
		t.Fatal(err)
	}
	for _, route := range []string{"/r", "/long"} {
		x, _ := e.Begin(ctx, postTo(route, "k"))
		if x == nil {
			t.Fatal("no execution")
		}
		defer x.Fail()
	}
	for _, step := range []struct {
		advance   time.Duration
		route     string
		want      string
		situation string
	}{
		{0, "/r", "1", "just acquired"},
		{10 * time.Second, "/r", "1", "renewal due, 20s left"},
		{3500 * time.Millisecond, "/r", "1", "16.5s left: a renewal may still be on its way"},
		{time.Second, "/r", "16", "15.5s left: stopped renewing"},
		{10 * time.Second, "/r", "6", "5.5s left"},
		{5 * time.Second, "/r", "1", "0.5s left: the short delay at least"},
		{0, "/long", "1", "2m lease, 90.5s left"}, // renewing: more than 120-40-4 = 76s
		{20 * time.Second, "/long", "71", "2m lease, 70.5s left"},
	} {
		store.advance(step.advance)
		if got := retryAfter(e, step.route); got != step.want {
			t.Errorf("%s: Retry-After %s, want %s", step.situation, got, step.want)
		}
	}

	// The store does not tell, or cannot renew: always the short delay.
	for name, s := range map[string]Store{"no LeaseLeft": newClockStore(), "no Extender": storeOnly{newClockStore()}} {
		cs, _ := s.(*clockStore)
		if cs == nil {
			cs = s.(storeOnly).Store.(*clockStore)
		}
		cs.leaseLeft = name != "no LeaseLeft"
		e, err := New(s, WithLease(30*time.Second), WithRetryAfter(1500*time.Millisecond), quiet)
		if err != nil {
			t.Fatal(err)
		}
		x, _ := e.Begin(ctx, postTo("/r", "k"))
		cs.advance(25 * time.Second)
		if got := retryAfter(e, "/r"); got != "2" {
			t.Errorf("%s: Retry-After %s, want the short 2", name, got)
		}
		x.Fail()
	}
}

// TestConflictRetryAfterRendered: every Retry-After value carries the
// renderer's body and content type, and answers after the first one
// allocate nothing.
func TestConflictRetryAfterRendered(t *testing.T) {
	e, err := New(newClockStore(), WithProblemRenderer(func(p Problem) (string, []byte) {
		return "application/vnd.app+json", []byte(p.Title)
	}))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{1, 7, maxCachedRetryAfter, maxCachedRetryAfter + 1} {
		r := e.problems.inProgressFor(n)
		if r.Status != 409 || string(r.Body) != "Request in progress" || r.Header.Get("Content-Type") != "application/vnd.app+json" ||
			r.Header.Get("Retry-After") != strconv.FormatInt(n, 10) {
			t.Errorf("%d: %d %v %s", n, r.Status, r.Header, r.Body)
		}
		if n <= maxCachedRetryAfter {
			if a := testing.AllocsPerRun(100, func() { e.problems.inProgressFor(n) }); a != 0 {
				t.Errorf("%d: %v allocations per answer, want 0", n, a)
			}
		}
	}
	if e.problems.inProgressFor(1) != e.problems.inProgress {
		t.Error("the default Retry-After is not the pre-built 409")
	}
}
