package storetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// crashable hides a store's lease renewal ([idem.Extender]) and
// [idem.LocalStore], keeping what recovery uses: an execution held in its
// function past its lease looks crashed.
type crashable struct {
	idem.Store
	idem.Keeper
	idem.Journal
	idem.Recoverable
	idem.StepResolver
}

// RunRecoverer checks, through a real [idem.Engine] and [idem.Recoverer],
// that the store's recovery payloads survive the round trip: an HTTP
// request of a recoverable route and an [idem.Do] operation whose holders
// stopped after a journaled step (1s leases, renewal hidden) are each
// claimed and run again once by a Recoverer (the HTTP one through
// [idem.HTTPRunner] with its principal, declared header line and body),
// their step replayed, and a client's late retry gets the stored answer.
// Leases are 2s, store calls bounded by 500ms.
func RunRecoverer(t *testing.T, newStore func(t *testing.T) idem.Store) {
	s := newStore(t)
	c := crashable{Store: s, Keeper: keeper(t, s), Journal: journal(t, s), Recoverable: recoverable(t, s), StepResolver: stepResolver(t, s)}
	e, err := idem.New(c, idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithLease(2*time.Second),
		idem.WithStoreTimeout(500*time.Millisecond), idem.WithRoute("POST", "/v1/pay", idem.RouteRecovery("X-Source")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	hold := make(chan struct{})
	var held sync.WaitGroup
	t.Cleanup(held.Wait)
	t.Cleanup(func() { close(hold) })
	var runs, steps atomic.Int64
	var seen atomic.Pointer[string]
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		principal, ok := e.RecoveryPrincipal(r.Header.Get(idem.RecoveryHeader))
		if !ok {
			principal = r.Header.Get("X-User")
		}
		x, resp := e.BeginHTTP(r, "/v1/pay", principal)
		if resp != nil {
			resp.Send(w)
			return
		}
		cw, xr := x.Capture(w, r)
		n := runs.Add(1)
		body, _ := io.ReadAll(xr.Body)
		id, err := idem.Step(xr.Context(), "charge", func(context.Context) (string, error) { steps.Add(1); return "ch_1", nil })
		if err != nil {
			http.Error(cw, err.Error(), http.StatusInternalServerError)
			x.Finish(cw.Status(), w.Header())
			return
		}
		v := principal + "|" + r.Header.Get("X-Source") + "|" + string(body) + "|" + id
		seen.Store(&v)
		if n == 1 {
			<-hold // the holder stops
		}
		cw.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(cw, id)
		x.Finish(cw.Status(), w.Header())
	})
	newReq := func() *http.Request {
		r, _ := http.NewRequestWithContext(context.Background(), "POST", "/v1/pay?a=1", strings.NewReader(`{"amount":5}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-User", "alice")
		r.Header.Set("X-Source", "app")
		r.Header.Set("Idempotency-Key", `"pay\"1\\"`) // the key pay"1\ : re-sent escaped by the recoverer
		return r
	}
	held.Add(1)
	go func() {
		defer held.Done()
		for { // a store slow to answer the first call (503) is retried, as a client would
			if status, _ := idem.HTTPRunner(handler)(newReq()); status != http.StatusServiceUnavailable || runs.Load() > 0 {
				return
			}
		}
	}()
	op := idem.Operation{Scope: "acct", Name: "receipt", Key: "order-1", Payload: []byte("to:a@b"), Input: []byte(`{"to":"a@b"}`), Recover: true}
	var opRuns atomic.Int64
	opFn := func(ctx context.Context) (string, error) {
		n := opRuns.Add(1)
		id, err := idem.Step(ctx, "send", func(context.Context) (string, error) { steps.Add(1); return "msg-1", nil })
		if err == nil && n == 1 {
			<-hold
		}
		return id, err
	}
	held.Add(1)
	go func() {
		defer held.Done()
		for { // a store slow to answer the first call (503) is retried, as a client would
			if _, err := idem.Do(context.Background(), e, op, opFn); !errors.Is(err, idem.ErrUnavailable) || opRuns.Load() > 0 {
				return
			}
		}
	}()
	for deadline := time.Now().Add(2 * time.Minute); steps.Load() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the first runs never ran their steps (%d)", steps.Load())
		}
	}
	r, err := idem.NewRecoverer(e, idem.RecoverRequests(idem.HTTPRunner(handler)), idem.RecoverBackoff(50*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r.Handle("receipt", func(ctx context.Context, op idem.Operation) error {
		if string(op.Input) != `{"to":"a@b"}` || string(op.Payload) != "to:a@b" {
			return fmt.Errorf("the recovery function got input %q, payload %q; want what Do was given", op.Input, op.Payload)
		}
		_, err := idem.Do(ctx, e, op, opFn)
		return err
	})
	var sum idem.RecoveryReport
	for deadline := time.Now().Add(2 * time.Minute); sum.Recovered < 2; time.Sleep(100 * time.Millisecond) {
		rep, err := r.RecoverOnce(context.Background()) // an error (a slow store) is tried again by the next pass
		sum.Claimed += rep.Claimed
		sum.Recovered += rep.Recovered
		sum.Deferred += rep.Deferred
		if time.Now().After(deadline) {
			t.Logf("last pass: %v", err)
			t.Fatalf("recovery: %+v (handler runs %d, operation runs %d)", sum, runs.Load(), opRuns.Load())
		}
	}
	// A run deferred by a slow store call is claimed again; none runs a step twice.
	if sum.Claimed != 2+sum.Deferred || runs.Load() < 2 || opRuns.Load() < 2 || steps.Load() != 2 {
		t.Fatalf("recovery %+v, handler runs %d, operation runs %d, step runs %d; want each run again until recovered, its step replayed",
			sum, runs.Load(), opRuns.Load(), steps.Load())
	}
	if v := seen.Load(); v == nil || *v != `alice|app|{"amount":5}|ch_1` {
		t.Fatalf("the recovery run saw %v; want principal, declared header, body and the journaled step", v)
	}
	w := &recorder{h: http.Header{}}
	handler.ServeHTTP(w, newReq())
	before := runs.Load()
	if w.status != http.StatusCreated || w.body.String() != "ch_1" || w.h.Get(idem.ReplayedHeader) != "true" || runs.Load() != before {
		t.Fatalf("the client's late retry: %d %q replayed %q; want the recovery's 201 replayed", w.status, w.body.String(), w.h.Get(idem.ReplayedHeader))
	}
	opBefore := opRuns.Load()
	if v, err := idem.Do(context.Background(), e, op, opFn); err != nil || v != "msg-1" || opRuns.Load() != opBefore {
		t.Fatalf("Do after the recovery: %q %v (runs %d); want the stored result", v, err, opRuns.Load())
	}
}

// recorder is a minimal http.ResponseWriter keeping status, header and body.
type recorder struct {
	h      http.Header
	status int
	body   strings.Builder
}

func (r *recorder) Header() http.Header { return r.h }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}
