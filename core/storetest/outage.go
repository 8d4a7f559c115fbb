package storetest

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// Outage is a store whose server a test can make unreachable and reachable
// again, for [RunOutage]. The store's test builds it however its server
// allows: stopping a private server and starting it again on the same
// address, or cutting a TCP proxy in front of a shared one (a toxiproxy,
// or [Proxy]).
type Outage struct {
	// Store is the store under test, connected to the server Cut stops. Its
	// client must give up on a dial within about a second (a connect or
	// server-selection timeout), as production configurations do.
	Store idem.Store
	// Cut makes the server unreachable and returns once it is: connections
	// already open fail, new ones are refused or time out.
	Cut func()
	// Restore makes the server reachable again at the same address and
	// returns once it accepts connections. A restarted server may have lost
	// its records; RunOutage does not rely on them.
	Restore func()
	// During, if set, runs store-specific checks while the server is
	// unreachable (after Cut, before the suite's own checks), such as the
	// wording of the store's errors.
	During func(t *testing.T)
}

// outageTimeout bounds each store call during the outage, as the engine's
// store timeout does (idem.WithStoreTimeout).
const outageTimeout = time.Second

// RunOutage checks what a store does while its server is unreachable and
// after it comes back, with the same store value and client throughout (no
// restart of the application):
//
//   - during the outage Acquire, Complete, Release and Get return an error
//     (never "acquired", never "not found") once their context's deadline
//     passes, and an engine on the store answers 503 store-unavailable with
//     Retry-After and executes nothing;
//   - once the server is back, Acquire, Complete and Get work again within
//     20s, and the engine executes a new key once and replays it.
//
// newOutage is called once; it registers its own cleanups with t.
func RunOutage(t *testing.T, newOutage func(t *testing.T) Outage) {
	o := newOutage(t)
	s := o.Store
	e, err := idem.New(s, idem.WithStoreTimeout(outageTimeout), idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // stop the background releases of acquires that failed during the outage
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = e.Close(ctx)
	})
	executions := map[string]int{}
	run := func(key string) *idem.Response {
		x, resp := e.Begin(ctx(t), &idem.Request{Method: http.MethodPost, Path: "/v1/payments",
			ContentType: "application/json", Keys: []string{key}, Principal: "alice", Body: []byte(`{"amount":1}`)})
		if x == nil {
			return resp
		}
		executions[key]++
		_, _ = x.Write([]byte(`{"ok":true}`))
		x.Finish(http.StatusCreated, http.Header{"Content-Type": {"application/json"}})
		return nil
	}

	// Before: the store works, and one key is left in progress for the
	// owner-only calls during the outage.
	if resp := run("before"); resp != nil {
		t.Fatalf("before the outage: %d %s; want executed", resp.Status, resp.Body)
	}
	held, tok := Key(), Token()
	mustAcquire(t, s, held, tok, fingerprint("held"), longLease)

	o.Cut()
	if o.During != nil {
		o.During(t)
	}
	bounded := func(op string, call func(context.Context) error) {
		t.Helper()
		c, cancel := context.WithTimeout(context.Background(), outageTimeout)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- call(c) }()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("%s while the server is unreachable: nil error; want the store's error", op)
			}
		case <-time.After(20 * outageTimeout): // a hang guard, not a speed check
			t.Fatalf("%s ignored its context: no answer 20s after its 1s deadline", op)
		}
	}
	fresh := Key()
	bounded("Acquire", func(c context.Context) error {
		_, ok, err := s.Acquire(c, fresh, Token(), fingerprint("fresh"), longLease)
		if ok {
			t.Errorf("Acquire while the server is unreachable reported acquired (err %v)", err)
		}
		return err
	})
	bounded("Get", func(c context.Context) error {
		_, found, err := s.Get(c, held)
		if found && err == nil {
			t.Errorf("Get while the server is unreachable found a record without error")
		}
		return err
	})
	bounded("Complete", func(c context.Context) error { return s.Complete(c, held, tok, sampleResponse(), retention) })
	bounded("Release", func(c context.Context) error { return s.Release(c, held, tok) })
	for i := range 2 { // the first call and a retry, after the client saw the failure
		resp := run("during")
		if resp == nil || resp.Status != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
			!bytes.Contains(resp.Body, []byte("store-unavailable")) {
			t.Fatalf("engine during the outage, try %d: %+v; want 503 store-unavailable with Retry-After", i, resp)
		}
	}
	if executions["during"] != 0 {
		t.Fatal("a request executed while the store was unreachable")
	}

	o.Restore()
	// Each attempt uses a fresh key: an attempt that timed out may still
	// have claimed its key on the server.
	deadline := time.Now().Add(2 * time.Minute)
	var key, owner string
	for {
		key, owner = Key(), Token()
		c, cancel := context.WithTimeout(context.Background(), outageTimeout)
		_, ok, err := s.Acquire(c, key, owner, fingerprint("after"), longLease)
		cancel()
		if ok && err == nil {
			break
		}
		if err == nil {
			t.Fatalf("Acquire of a fresh key after the restore: not acquired, no error")
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire still fails 2 minutes after the server came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mustComplete(t, s, key, owner, sampleResponse(), retention)
	rec, found, err := s.Get(ctx(t), key)
	if err != nil || !found || rec.State != idem.StateCompleted {
		t.Fatalf("Get after the restore = %+v, %v, %v; want the completed record", rec, found, err)
	}
	equalResponse(t, rec.Response, sampleResponse())

	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		resp := run("after")
		if resp == nil {
			break
		}
		if resp.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("engine after the restore: %d %s; want executed (or 503 while reconnecting, for at most 2 minutes)", resp.Status, resp.Body)
		}
	}
	if resp := run("after"); resp == nil || resp.Status != http.StatusCreated || !resp.IsReplay() ||
		!strings.Contains(string(resp.Body), `"ok"`) {
		t.Fatalf("duplicate after the restore: %+v; want a replay of the 201", resp)
	}
	if executions["before"] != 1 || executions["after"] != 1 || executions["during"] != 0 {
		t.Fatalf("executions = %v; want before 1, during 0, after 1", executions)
	}
}
