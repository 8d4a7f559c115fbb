package idem

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// txStore is a Transactional store in memory: records in a map, and per
// execution a unit whose pending writes reach committed only through
// Complete, as a database transaction would.
type txStore struct {
	mu        sync.Mutex
	recs      map[string]*Record
	committed []string
	direct    int // Complete and Release calls that bypassed the unit
}

type txUnit struct {
	s          *txStore
	key, token string
	pending    []string
	ended      bool
}

func newTxStore() *txStore { return &txStore{recs: map[string]*Record{}} }

func (s *txStore) Acquire(ctx context.Context, key, token, fp string, lease time.Duration) (Record, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.recs[key]; ok {
		return *r, false, nil
	}
	s.recs[key] = &Record{State: StateInProgress, Token: token, Fingerprint: fp}
	return Record{}, true, nil
}

func (s *txStore) complete(key, token string, resp []byte) error {
	r, ok := s.recs[key]
	if !ok || r.State != StateInProgress || r.Token != token {
		return ErrNotOwner
	}
	r.State, r.Response = StateCompleted, slices.Clone(resp)
	return nil
}

func (s *txStore) release(key, token string) error {
	r, ok := s.recs[key]
	if !ok || r.State != StateInProgress || r.Token != token {
		return ErrNotOwner
	}
	delete(s.recs, key)
	return nil
}

func (s *txStore) Complete(ctx context.Context, key, token string, resp []byte, retention time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.direct++
	return s.complete(key, token, resp)
}

func (s *txStore) Release(ctx context.Context, key, token string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.direct++
	return s.release(key, token)
}

func (s *txStore) Get(ctx context.Context, key string) (Record, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[key]
	if !ok {
		return Record{}, false, nil
	}
	return *r, true, nil
}

func (s *txStore) Unit(key, token string) Unit { return &txUnit{s: s, key: key, token: token} }

// write is what a handler does through its unit (pgstore.Tx's Exec).
func (u *txUnit) write(w string) { u.pending = append(u.pending, w) }

func (u *txUnit) Complete(ctx context.Context, resp []byte, retention time.Duration) error {
	u.s.mu.Lock()
	defer u.s.mu.Unlock()
	u.ended = true
	if err := u.s.complete(u.key, u.token, resp); err != nil {
		u.pending = nil // rolled back
		return err
	}
	u.s.committed = append(u.s.committed, u.pending...)
	return nil
}

func (u *txUnit) Release(ctx context.Context) error {
	u.s.mu.Lock()
	defer u.s.mu.Unlock()
	u.ended, u.pending = true, nil
	return u.s.release(u.key, u.token)
}

func txRequest(key string) *Request {
	return &Request{Method: "POST", Path: "/v1/payments", Keys: []string{key}, Principal: "alice", Body: []byte(`{"amount":1}`)}
}

// runTx begins an execution for key, binds the handler context like an
// adapter does, writes through the unit and ends with end.
func runTx(t *testing.T, e *Engine, key, write string, end func(*Execution)) *txUnit {
	t.Helper()
	x, resp := e.Begin(context.Background(), txRequest(key))
	if x == nil {
		t.Fatalf("Begin(%s) = %+v; want an execution", key, resp)
	}
	ctx := x.WithInfo(context.Background())
	u, ok := UnitFromContext(ctx).(*txUnit)
	if !ok {
		t.Fatalf("UnitFromContext = %T; want the store's unit", UnitFromContext(ctx))
	}
	if info, _ := InfoFromContext(ctx); info.Key != x.ev.Key {
		t.Fatalf("Info.Key = %q; want %q", info.Key, x.ev.Key)
	}
	u.write(write)
	end(x)
	if !u.ended {
		t.Fatal("the engine ended the execution without its unit")
	}
	return u
}

func TestTransactionalCompletion(t *testing.T) {
	s := newTxStore()
	var events []EventKind
	e, err := New(s, WithEventHook(func(_ context.Context, ev Event) { events = append(events, ev.Kind) }))
	if err != nil {
		t.Fatal(err)
	}
	runTx(t, e, "stored", "pay-1", func(x *Execution) {
		x.Write([]byte("ok"))
		x.Finish(201, http.Header{})
	})
	runTx(t, e, "server-error", "pay-2", func(x *Execution) { x.Finish(503, http.Header{}) })
	runTx(t, e, "handler-error", "pay-3", func(x *Execution) { x.Fail() })
	runTx(t, e, "panic", "pay-4", func(x *Execution) { x.Abort(0, nil) })
	runTx(t, e, "lease-lost", "pay-5", func(x *Execution) {
		s.mu.Lock()
		s.recs[x.ev.Key].Token = "takeover" // another instance took the lapsed lease over
		s.mu.Unlock()
		x.Finish(201, http.Header{})
	})
	if want := []string{"pay-1"}; !slices.Equal(s.committed, want) {
		t.Fatalf("committed writes %q; want %q (only the stored execution's)", s.committed, want)
	}
	if s.direct != 0 {
		t.Fatalf("%d Complete/Release calls bypassed the unit", s.direct)
	}
	if !slices.Contains(events, EventLeaseLost) {
		t.Fatalf("events %v; want a lease-lost event for the refused completion", events)
	}
	if _, resp := e.Begin(context.Background(), txRequest("stored")); resp == nil || !resp.IsReplay() || string(resp.Body) != "ok" {
		t.Fatalf("retry of the stored execution = %+v; want its replay", resp)
	}
	for _, k := range []string{"server-error", "handler-error", "panic"} {
		if x, _ := e.Begin(context.Background(), txRequest(k)); x == nil {
			t.Errorf("retry of %s: no execution; want the released key executed again", k)
		}
	}
}

// An adapter that never binds the handler context (no WithInfo) leaves the
// engine on the plain Store methods.
func TestTransactionalWithoutBinding(t *testing.T) {
	s := newTxStore()
	e, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := e.Begin(context.Background(), txRequest("k"))
	x.Finish(201, nil)
	if s.direct != 1 {
		t.Fatalf("%d direct store calls; want the one Complete", s.direct)
	}
	if UnitFromContext(context.Background()) != nil || UnitFromContext(ContextWithInfo(context.Background(), Info{Replayed: true})) != nil {
		t.Fatal("UnitFromContext outside an execution is not nil")
	}
}

// A unit's error other than ErrNotOwner is retried like a Store's.
type flakyUnit struct {
	Unit
	fails int
}

func (u *flakyUnit) Complete(ctx context.Context, resp []byte, retention time.Duration) error {
	if u.fails > 0 {
		u.fails--
		return errors.New("connection reset")
	}
	return u.Unit.Complete(ctx, resp, retention)
}

type flakyTxStore struct{ *txStore }

func (s flakyTxStore) Unit(key, token string) Unit {
	return &flakyUnit{Unit: s.txStore.Unit(key, token), fails: 1}
}

func TestTransactionalCompletionRetried(t *testing.T) {
	s := flakyTxStore{newTxStore()}
	e, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := e.Begin(context.Background(), txRequest("k"))
	u := UnitFromContext(x.WithInfo(context.Background())).(*flakyUnit)
	u.Unit.(*txUnit).write("pay")
	x.Finish(201, nil)
	if !slices.Equal(s.committed, []string{"pay"}) || s.direct != 0 {
		t.Fatalf("committed %q, %d direct calls; want the write committed by the unit's second attempt", s.committed, s.direct)
	}
}
