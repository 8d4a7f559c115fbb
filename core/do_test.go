package idem

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// The store-facing behaviour of Do (duplicates, concurrency, mismatch,
// errors, panics, takeover) is checked on every real store by
// storetest.RunDo; these tests cover what needs a scripted store.

func newDoEngine(t *testing.T, s Store, opts ...Option) *Engine {
	t.Helper()
	e, err := New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}

func one(context.Context) (int, error) { return 1, nil }

func TestDoStoreDown(t *testing.T) {
	s := newScriptStore(0)
	var events []EventKind
	e := newDoEngine(t, s, WithCompletionRetry(0), WithEventHook(func(_ context.Context, ev Event) { events = append(events, ev.Kind) }))
	down := errors.New("connection refused")
	s.failNext(OpAcquire, down)
	_, err := Do(context.Background(), e, Operation{Name: "op", Key: "k"}, func(context.Context) (int, error) {
		t.Error("fn ran with the store down")
		return 0, nil
	})
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, down) {
		t.Fatalf("got %v, want ErrUnavailable wrapping the store's error", err)
	}
	// A completion that fails on a store without transactions: fn's
	// effects are done, so its result is returned.
	s.failNext(OpComplete, down, down)
	if v, err := Do(context.Background(), e, Operation{Name: "op", Key: "k2"}, one); err != nil || v != 1 {
		t.Fatalf("failed completion, plain store: %v, %v; want the result", v, err)
	}
	if len(events) == 0 || events[0] != EventStoreError {
		t.Fatalf("events %v, want the engine's events", events)
	}
}

func TestDoTransactionRolledBack(t *testing.T) {
	s := &failingTxStore{newTxStore()}
	e := newDoEngine(t, s, WithCompletionRetry(0))
	_, err := Do(context.Background(), e, Operation{Name: "op", Key: "k"}, func(ctx context.Context) (int, error) {
		UnitFromContext(ctx).(*failingUnit).write("receipt")
		return 1, nil
	})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("got %v, want ErrUnavailable: the transaction did not commit", err)
	}
	if len(s.committed) != 0 {
		t.Fatalf("committed %q", s.committed)
	}
}

type failingTxStore struct{ *txStore }

func (s *failingTxStore) Unit(key, token string) Unit {
	return &failingUnit{s.txStore.Unit(key, token).(*txUnit)}
}

type failingUnit struct{ *txUnit }

func (u *failingUnit) Complete(context.Context, []byte, time.Duration) error {
	u.pending = nil
	return errors.New("commit: connection reset")
}

func TestDoInvalid(t *testing.T) {
	e := newDoEngine(t, newScriptStore(0))
	for _, op := range []Operation{{Key: "k"}, {Name: "op"}, {Name: "op", Key: strings.Repeat("k", MaxKeyLength+1)}} {
		if _, err := Do(context.Background(), e, op, one); err == nil {
			t.Errorf("%+v: no error", op)
		}
	}
}

// An operation never shares a record with an HTTP request of the same
// engine, whatever its scope, name and key.
func TestDoScopedApartFromHTTP(t *testing.T) {
	s := newScriptStore(0)
	e := newDoEngine(t, s, WithMethods("DO"))
	if _, err := Do(context.Background(), e, Operation{Scope: "p", Name: "/charge", Key: "k"}, one); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"POST", "DO"} {
		x, resp := e.Begin(context.Background(), &Request{Method: m, Route: "/charge", Keys: []string{"k"}, Principal: "p"})
		if x == nil {
			t.Fatalf("%s: got %+v, want an execution of its own", m, resp)
		}
		x.Finish(200, nil)
	}
}

func TestDoCorruptRecord(t *testing.T) {
	s := newScriptStore(0)
	e := newDoEngine(t, s)
	op := Operation{Name: "op", Key: "k"}
	s.recs[ScopedKey("", doMethod, "op", "k")] = Record{State: StateCompleted, Fingerprint: Fingerprint(doMethod, "op", "", "", nil), Response: []byte("junk")}
	if _, err := Do(context.Background(), e, op, one); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("got %v, want ErrCorrupt", err)
	}
}

func TestDoWaitsForCompletionRetry(t *testing.T) {
	s := newScriptStore(0)
	e := newDoEngine(t, s, WithCompletionRetry(time.Minute))
	s.failNext(OpComplete, errors.New("blip"), errors.New("blip"), errors.New("blip"))
	if v, err := Do(context.Background(), e, Operation{Name: "op", Key: "k"}, one); err != nil || v != 1 {
		t.Fatalf("%v, %v", v, err)
	}
	rec, _, _ := s.Get(context.Background(), ScopedKey("", doMethod, "op", "k"))
	if rec.State != StateCompleted {
		t.Fatalf("Do returned before the record was completed: %v", rec.State)
	}
}

func TestBytesCodec(t *testing.T) {
	for _, v := range []any{[]byte("x"), "x"} {
		b, err := BytesCodec.Marshal(v)
		if err != nil || string(b) != "x" {
			t.Fatalf("%T: %q %v", v, b, err)
		}
	}
	if _, err := BytesCodec.Marshal(1); err == nil {
		t.Fatal("Marshal(int): no error")
	}
	var n int
	if err := BytesCodec.Unmarshal([]byte("1"), &n); err == nil {
		t.Fatal("Unmarshal(*int): no error")
	}
}
