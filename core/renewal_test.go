package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"
)

// renewStore is a Store and Extender that acquires every key, counts the
// Extend calls per key and records each call's context deadline; block
// makes Acquire wait until its context is done.
type renewStore struct {
	mu        sync.Mutex
	extended  map[string]int
	deadlines []time.Time // of each Acquire's context
	entered   []time.Time // when each Acquire began
	block     bool
}

func (s *renewStore) Acquire(ctx context.Context, _, _, _ string, _ time.Duration) (Record, bool, error) {
	now := time.Now()
	d, _ := ctx.Deadline()
	s.mu.Lock()
	s.deadlines = append(s.deadlines, d)
	s.entered = append(s.entered, now)
	block := s.block
	s.mu.Unlock()
	if block {
		<-ctx.Done()
		return Record{}, false, ctx.Err()
	}
	return Record{}, true, nil
}

func (s *renewStore) Complete(context.Context, string, string, []byte, time.Duration) error {
	return nil
}

func (s *renewStore) Release(context.Context, string, string) error { return nil }

func (s *renewStore) Get(context.Context, string) (Record, bool, error) {
	return Record{}, false, nil
}

func (s *renewStore) Extend(_ context.Context, key, _ string, _ time.Duration) error {
	s.mu.Lock()
	s.extended[key]++
	s.mu.Unlock()
	return nil
}

func (s *renewStore) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.extended[key]
}

// waitUntil polls cond for up to 20 s (a loaded machine may delay timers a
// lot; the conditions hold long before on a quiet one).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *renewals) state() (queued int, running bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.h), r.running
}

// TestRenewalsShared: the executions of one engine are renewed by one
// scheduler, each until it finishes, and the scheduler's goroutine exits
// when none is left after Close; Begin still renews after Close.
func TestRenewalsShared(t *testing.T) {
	store := &renewStore{extended: map[string]int{}}
	e, err := New(store, WithGlobalScope(), WithLease(120*time.Millisecond), WithStoreTimeout(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	xs := make([]*Execution, n)
	keys := make([]string, n)
	for i := range xs {
		x, resp := e.Begin(context.Background(), &Request{Method: http.MethodPost, Path: "/p", Keys: []string{fmt.Sprintf("key-%d", i)}})
		if x == nil {
			t.Fatalf("Begin %d = %v, want an execution", i, resp)
		}
		xs[i], keys[i] = x, x.ev.Key
	}
	if q, running := e.renewals.state(); q != n || !running {
		t.Fatalf("renewals: %d queued, running %v; want %d, true", q, running, n)
	}
	waitUntil(t, "every lease renewed twice", func() bool {
		for _, k := range keys {
			if store.count(k) < 2 {
				return false
			}
		}
		return true
	})
	for i, x := range xs {
		if i%2 == 0 {
			x.Finish(http.StatusCreated, nil)
		} else {
			x.Fail()
		}
		if x.slot != -1 {
			t.Fatalf("execution %d still queued after it ended", i)
		}
	}
	if q, _ := e.renewals.state(); q != 0 {
		t.Fatalf("%d executions queued after all ended", q)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the renewal goroutine to exit after Close", func() bool { _, running := e.renewals.state(); return !running })

	x, _ := e.Begin(context.Background(), &Request{Method: http.MethodPost, Path: "/p", Keys: []string{"after-close"}})
	if x == nil {
		t.Fatal("Begin after Close: no execution")
	}
	waitUntil(t, "a renewal after Close", func() bool { return store.count(x.ev.Key) >= 1 })
	x.Finish(http.StatusCreated, nil)
	waitUntil(t, "the renewal goroutine to exit again", func() bool { _, running := e.renewals.state(); return !running })
}

// TestRenewalsIdleExit: without Close, the goroutine exits renewIdle after
// the last execution ended, and starts again with the next one.
func TestRenewalsIdleExit(t *testing.T) {
	store := &renewStore{extended: map[string]int{}}
	e, err := New(store, WithGlobalScope(), WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		x, _ := e.Begin(context.Background(), &Request{Method: http.MethodPost, Path: "/p", Keys: []string{fmt.Sprintf("idle-%d", i)}})
		if x == nil {
			t.Fatal("no execution")
		}
		if _, running := e.renewals.state(); !running {
			t.Fatal("renewals not running with an execution registered")
		}
		x.Finish(http.StatusCreated, nil)
		waitUntil(t, "the idle renewal goroutine to exit", func() bool { _, running := e.renewals.state(); return !running })
	}
}

// TestStoreCallDeadline: a store call that hangs ends at the store
// timeout, with a deadline no later than the timeout after the call began
// and no earlier than 15/16 of it; with a cancellable request context the
// call also follows that context's cancellation.
func TestStoreCallDeadline(t *testing.T) {
	const timeout = 80 * time.Millisecond
	store := &renewStore{extended: map[string]int{}, block: true}
	e, err := New(store, WithGlobalScope(), WithStoreTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		before := time.Now()
		x, resp := e.Begin(context.Background(), &Request{Method: http.MethodPost, Path: "/p", Keys: []string{fmt.Sprintf("hang-%d", i)}})
		if x != nil || resp == nil || resp.Status != http.StatusServiceUnavailable {
			t.Fatalf("Begin on a hung store = %v, %v; want 503", x, resp)
		}
		store.mu.Lock()
		d, entered := store.deadlines[len(store.deadlines)-1], store.entered[len(store.entered)-1]
		store.mu.Unlock()
		if d.IsZero() || d.After(entered.Add(timeout)) || d.Before(before.Add(timeout-timeout/16)) {
			t.Fatalf("call %d: deadline %v after Begin and %v after Acquire began, want at least %v and at most %v", i, d.Sub(before), d.Sub(entered), timeout-timeout/16, timeout)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *Response)
	go func() {
		_, resp := e.Begin(ctx, &Request{Method: http.MethodPost, Path: "/p", Keys: []string{"cancelled"}})
		done <- resp
	}()
	cancel()
	if resp := <-done; resp == nil || resp.Status != http.StatusServiceUnavailable {
		t.Fatalf("Begin with a cancelled context = %v, want 503", resp)
	}
}

// TestStoreCtxDerived: contexts derived from a storeCtx, and
// context.AfterFunc on it, end with its shared deadline, carry its parent's
// values, and are registered with the shared deadline (no goroutine each).
func TestStoreCtxDerived(t *testing.T) {
	type key struct{}
	d := newDeadlines(50 * time.Millisecond)
	parent := context.WithValue(context.Background(), key{}, "v")
	sc := &storeCtx{parent: parent, slot: d.at(time.Now())}
	if sc.Value(key{}) != "v" {
		t.Fatal("parent's value lost")
	}
	if _, ok := sc.Deadline(); !ok {
		t.Fatal("no deadline")
	}
	base := runtime.NumGoroutine()
	var stops []func() bool
	for range 200 {
		stops = append(stops, context.AfterFunc(sc, func() {}))
	}
	if n := runtime.NumGoroutine() - base; n > 50 {
		t.Errorf("200 AfterFunc on a storeCtx started %d goroutines, want them registered with its deadline", n)
	}
	for _, stop := range stops {
		stop()
	}
	child, cancel := context.WithCancel(sc)
	defer cancel()
	fired := make(chan struct{})
	context.AfterFunc(sc, func() { close(fired) })
	stopped := context.AfterFunc(sc, func() { t.Error("stopped AfterFunc ran") })
	if !stopped() {
		t.Fatal("AfterFunc stop = false before the deadline")
	}
	<-child.Done()
	<-fired
	if !errors.Is(child.Err(), context.DeadlineExceeded) || !errors.Is(sc.Err(), context.DeadlineExceeded) {
		t.Fatalf("errors %v, %v; want deadline exceeded", child.Err(), sc.Err())
	}
}

// failingExtendStore is a renewStore whose Extend fails as a store that
// went down does.
type failingExtendStore struct{ renewStore }

func (*failingExtendStore) Extend(context.Context, string, string, time.Duration) error {
	return errors.New("dial tcp: connection refused")
}

// TestRenewalFailureAfterEnd: a renewal that fails while the execution
// runs is a store-error event; one that was under way when the execution's
// completion ended (its failure arriving after it) reports nothing, so
// that a store that goes down right after a completion counts no error for
// it. renew is called directly: the scheduler's timing plays no part.
func TestRenewalFailureAfterEnd(t *testing.T) {
	var (
		mu  sync.Mutex
		got []Event
	)
	hook := func(_ context.Context, ev Event) {
		if ev.Kind == EventStoreError {
			mu.Lock()
			got = append(got, ev)
			mu.Unlock()
		}
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	e, err := New(&failingExtendStore{renewStore{extended: map[string]int{}}}, WithGlobalScope(), WithLease(time.Hour), WithEventHook(hook), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	x, resp := e.Begin(context.Background(), &Request{Method: http.MethodPost, Path: "/p", Keys: []string{"k"}})
	if x == nil {
		t.Fatalf("Begin = %v, want an execution", resp)
	}
	e.renew(x)
	if n := count(); n != 1 {
		t.Fatalf("a failed renewal while the handler runs: %d store-error events, want 1", n)
	}
	x.Finish(http.StatusCreated, nil)
	e.renew(x) // the renewal that was under way when the completion ended
	if n := count(); n != 1 {
		t.Fatalf("a failed renewal after the completion: %d store-error events in all, want still 1 (%+v)", n, got)
	}
}
