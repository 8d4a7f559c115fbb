package storetest

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// TxHooks is the handler's side of an [idem.Transactional] store, for
// [RunTransactional]: how a handler writes through its execution's
// transaction, and how the test reads what was committed. Both are bound
// to the store they are returned with (its table, its client); the suite
// never needs the store's transaction type.
type TxHooks struct {
	// Write writes one row tagged tag through the transaction of the
	// execution whose handler ctx belongs to, as a handler does with the
	// store's helper (e.g. pgstore.Tx). It returns the helper's error,
	// which wraps NoExecution for a ctx of no execution and Ended once
	// the execution ended.
	Write func(ctx context.Context, tag string) error
	// Rows returns the number of committed rows tagged tag, read outside
	// any execution's transaction.
	Rows func(t *testing.T, tag string) int
	// Held, if set, returns how many connections the store's client still
	// holds (checked out of its pool); the suite expects 0 once every
	// execution ended. Optional.
	Held func() int
	// NoExecution is the helper's error for a context that carries no
	// execution (e.g. pgstore.ErrNoExecution). Optional: when nil any
	// error will do, as for Ended.
	NoExecution error
	// Ended is the helper's error once the execution ended (e.g.
	// pgstore.ErrExecutionEnded).
	Ended error
	// KillConnection, if set, kills from another session the server
	// connection of the transaction of the execution whose handler ctx
	// belongs to (pg_terminate_backend, KILL CONNECTION), and returns once
	// it is gone. Optional: without it the ConnectionLost subtest is not run.
	KillConnection func(t *testing.T, ctx context.Context)
}

// RunTransactional checks the [idem.Transactional] contract (core/store.go,
// [idem.Unit]; Stripe's "atomic phases") through an engine, the way a
// handler sees it:
//
//   - a handler's writes are invisible outside its transaction until the
//     engine commits them with the stored response (2xx and 4xx); a
//     retry then replays, and another Unit.Complete returns nil (the
//     commit landed);
//   - they are rolled back when the key is released (5xx, handler error,
//     panic before a response), and a retry executes again;
//   - they are rolled back when the lease was lost (another token took
//     the key), the other holder's record is untouched, and another
//     Unit.Complete still returns [idem.ErrNotOwner];
//   - a Unit that implements [idem.RollbackUnit] (as a recovery run that
//     ends without an answer uses it) rolls the writes back and closes the
//     transaction on Rollback, any number of times, leaving the record in
//     progress under its token;
//   - Unit.Complete with an invalid retention returns
//     [idem.ErrInvalidDuration] and leaves the transaction open;
//   - when the transaction's connection dies before the completion, the
//     writes are gone, the response is not stored (a lease-lost event, no
//     completed one) and the key is released so a retry executes at once
//     (with [TxHooks.KillConnection]); when a step was journaled
//     ([idem.Step], stores that implement [idem.Journal]) the record is
//     not released but left to lapse at once, its journal kept, so the
//     retry replays the step instead of running it again;
//   - a handler that never asks for its transaction completes as on a
//     plain store;
//   - the transaction is closed to the handler once its execution ended,
//     and refused outside an execution.
//
// newStore is called once per subtest and must return a store that
// implements [idem.Transactional], isolated from the others, with its
// hooks. Store-specific failures (a connection killed before the commit,
// isolation levels, what the handler may call on the transaction) stay in
// the store's own tests.
func RunTransactional(t *testing.T, newStore func(t *testing.T) (idem.Store, TxHooks)) {
	tests := []struct {
		name string
		fn   func(*testing.T, *txProbe, TxHooks)
	}{
		{"CommitWithStoredResponse", testTxCommit},
		{"RollbackOnRelease", testTxRollbackOnRelease},
		{"RollbackOnLostLease", testTxLostLease},
		{"RollbackKeepsRecord", testTxRollbackKeepsRecord},
		{"InvalidRetentionKeepsTransaction", testTxInvalidRetention},
		{"TransactionUnused", testTxUnused},
		{"ConnectionLost", testTxConnectionLost},
		{"ConnectionLostKeepsJournal", testTxConnectionLostJournal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, hooks := newStore(t)
			tx, ok := s.(idem.Transactional)
			if !ok {
				t.Fatalf("%T does not implement idem.Transactional", s)
			}
			p := &txProbe{Store: s, tx: tx, tokens: map[string]string{}, units: map[string]idem.Unit{}}
			tt.fn(t, p, hooks)
			if hooks.Held != nil {
				if n := hooks.Held(); n != 0 {
					t.Errorf("%d connections still held after every execution ended", n)
				}
			}
		})
	}
}

// txProbe is the store under test as the engine sees it (no
// [idem.Extender]: leases are never renewed), remembering the token of
// each key's last acquisition and the Unit the engine asked for.
type txProbe struct {
	idem.Store
	tx idem.Transactional

	mu     sync.Mutex
	tokens map[string]string    // scoped key → token that acquired it last
	units  map[string]idem.Unit // scoped key → the execution's Unit
}

func (p *txProbe) Acquire(ctx context.Context, key, token, fp string, lease time.Duration) (idem.Record, bool, error) {
	rec, ok, err := p.Store.Acquire(ctx, key, token, fp, lease)
	if ok && err == nil {
		p.mu.Lock()
		p.tokens[key] = token
		p.mu.Unlock()
	}
	return rec, ok, err
}

func (p *txProbe) Unit(key, token string) idem.Unit {
	u := p.tx.Unit(key, token)
	p.mu.Lock()
	p.units[key] = u
	p.mu.Unlock()
	return u
}

// scoped is the store key of the suite's request with idempotency key k.
func scoped(k string) string { return idem.ScopedKey("alice", http.MethodPost, "/v1/payments", k) }

func (p *txProbe) unit(t *testing.T, k string) idem.Unit {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	u := p.units[scoped(k)]
	if u == nil {
		t.Fatalf("%s: the engine asked the store for no Unit", k)
	}
	return u
}

func txRequest(k string) *idem.Request {
	return &idem.Request{Method: http.MethodPost, Path: "/v1/payments", ContentType: "application/json",
		Keys: []string{k}, Principal: "alice", Body: []byte(`{"amount":1}`)}
}

// begin starts an execution of k and returns it with its handler's
// context, after the handler wrote two rows tagged k through its
// transaction (the second through the same transaction, asked again).
func begin(t *testing.T, e *idem.Engine, p *txProbe, h TxHooks, k string) (*idem.Execution, context.Context) {
	t.Helper()
	x, resp := e.Begin(ctx(t), txRequest(k))
	if x == nil {
		t.Fatalf("Begin(%s) = %+v; want an execution", k, resp)
	}
	c := x.WithInfo(ctx(t))
	u := p.unit(t, k)
	t.Cleanup(func() {
		if t.Failed() { // a check stopped the test mid-execution: end its transaction, which holds a connection
			_ = u.Release(context.Background())
		}
	})
	for range 2 {
		if err := h.Write(c, k); err != nil {
			t.Fatalf("%s: the handler's write: %v", k, err)
		}
	}
	if n := h.Rows(t, k); n != 0 {
		t.Fatalf("%s: %d uncommitted rows visible outside the execution's transaction", k, n)
	}
	return x, c
}

// refused reports whether err is an error wrapping want (any error when
// want is nil).
func refused(err, want error) bool { return err != nil && (want == nil || errors.Is(err, want)) }

// ended checks that the handler's transaction is closed once its execution ended.
func ended(c context.Context, t *testing.T, h TxHooks, k string) {
	t.Helper()
	if err := h.Write(c, k); !refused(err, h.Ended) {
		t.Fatalf("%s: a write through the transaction after the execution ended = %v; want %v", k, err, h.Ended)
	}
}

func testTxCommit(t *testing.T, p *txProbe, h TxHooks) {
	e := doEngine(t, p)
	if err := h.Write(ctx(t), "none"); !refused(err, h.NoExecution) {
		t.Fatalf("a write through the transaction of no execution = %v; want %v", err, h.NoExecution)
	}
	for _, c := range []struct {
		k      string
		status int
	}{{"created", http.StatusCreated}, {"client-error", http.StatusBadRequest}} {
		x, hc := begin(t, e, p, h, c.k)
		_, _ = x.Write([]byte("done"))
		x.Finish(c.status, nil)
		ended(hc, t, h, c.k)
		if n := h.Rows(t, c.k); n != 2 {
			t.Fatalf("%s (%d stored): %d rows committed; want the handler's 2", c.k, c.status, n)
		}
		if _, resp := e.Begin(ctx(t), txRequest(c.k)); resp == nil || !resp.IsReplay() || resp.Status != c.status || string(resp.Body) != "done" {
			t.Fatalf("retry of %s = %+v; want the replay of its %d", c.k, resp, c.status)
		}
		// The engine may call Complete again after an error it cannot
		// settle; after a commit that landed the answer is nil.
		if err := p.unit(t, c.k).Complete(ctx(t), sampleResponse(), retention); err != nil {
			t.Fatalf("%s: Unit.Complete again after the commit = %v; want nil", c.k, err)
		}
		if n := h.Rows(t, c.k); n != 2 {
			t.Fatalf("%s: %d rows after a second Unit.Complete; want 2", c.k, n)
		}
	}
}

func testTxRollbackOnRelease(t *testing.T, p *txProbe, h TxHooks) {
	e := doEngine(t, p)
	for k, end := range map[string]func(*idem.Execution){
		"server-error":  func(x *idem.Execution) { _, _ = x.Write([]byte("busy")); x.Finish(http.StatusServiceUnavailable, nil) },
		"handler-error": (*idem.Execution).Fail,
		"panic":         func(x *idem.Execution) { x.Abort(0, nil) }, // a panic before any response
	} {
		x, hc := begin(t, e, p, h, k)
		end(x)
		ended(hc, t, h, k)
		if n := h.Rows(t, k); n != 0 {
			t.Errorf("%s: %d rows committed; want 0 (rolled back with the release)", k, n)
		}
		x, resp := e.Begin(ctx(t), txRequest(k))
		if x == nil {
			t.Fatalf("retry of %s = %+v; want an execution (the key was released)", k, resp)
		}
		x.Fail()
	}
}

func testTxRollbackKeepsRecord(t *testing.T, p *txProbe, h TxHooks) {
	e := doEngine(t, p)
	const k = "rolled-back"
	x, hc := begin(t, e, p, h, k)
	r, ok := p.unit(t, k).(idem.RollbackUnit)
	if !ok {
		x.Fail()
		t.Skipf("%T's Unit does not implement idem.RollbackUnit", p.Store)
	}
	for range 2 { // idempotent
		if err := r.Rollback(ctx(t)); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
	}
	ended(hc, t, h, k)
	if n := h.Rows(t, k); n != 0 {
		t.Errorf("%d rows committed after Rollback; want 0", n)
	}
	key := scoped(k)
	p.mu.Lock()
	tok := p.tokens[key]
	p.mu.Unlock()
	if rec, found := get(t, p.Store, key); !found || rec.State != idem.StateInProgress || rec.Token != tok {
		t.Fatalf("record after Rollback = %+v, %v; want in progress under %s", rec, found, tok)
	}
	x.Fail() // ends the execution: releases the record
	if n := h.Rows(t, k); n != 0 {
		t.Errorf("%d rows committed after Rollback and release; want 0", n)
	}
}

func testTxLostLease(t *testing.T, p *txProbe, h TxHooks) {
	e := doEngine(t, p)
	const k = "lease-lost"
	x, hc := begin(t, e, p, h, k)
	// Another execution holds the key now, as after a takeover of a lapsed
	// lease.
	key := scoped(k)
	p.mu.Lock()
	tok := p.tokens[key]
	p.mu.Unlock()
	if err := p.Store.Release(ctx(t), key, tok); err != nil {
		t.Fatal(err)
	}
	other := Token()
	mustAcquire(t, p.Store, key, other, fingerprint("other"), longLease)
	_, _ = x.Write([]byte("done"))
	x.Finish(http.StatusCreated, nil)
	ended(hc, t, h, k)
	if n := h.Rows(t, k); n != 0 {
		t.Fatalf("%d rows committed by an execution that lost its lease; want 0", n)
	}
	if err := p.unit(t, k).Complete(ctx(t), sampleResponse(), retention); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Unit.Complete again after the lost lease = %v; want ErrNotOwner", err)
	}
	rec, found, err := p.Get(ctx(t), key)
	if err != nil || !found || rec.State != idem.StateInProgress || rec.Token != other {
		t.Fatalf("Get = %+v, %v, %v; want the other holder's in-progress record", rec, found, err)
	}
	if n := h.Rows(t, k); n != 0 {
		t.Fatalf("%d rows after a second Unit.Complete; want 0", n)
	}
}

func testTxInvalidRetention(t *testing.T, p *txProbe, h TxHooks) {
	e := doEngine(t, p)
	const k = "invalid-retention"
	x, hc := begin(t, e, p, h, k)
	if err := p.unit(t, k).Complete(ctx(t), sampleResponse(), 0); !errors.Is(err, idem.ErrInvalidDuration) {
		t.Fatalf("Unit.Complete with retention 0 = %v; want ErrInvalidDuration", err)
	}
	if err := h.Write(hc, k); err != nil {
		t.Fatalf("a write after the refused Unit.Complete: %v; want the transaction still open", err)
	}
	_, _ = x.Write([]byte("done"))
	x.Finish(http.StatusCreated, nil)
	if n := h.Rows(t, k); n != 3 {
		t.Fatalf("%d rows committed; want the handler's 3", n)
	}
}

func testTxUnused(t *testing.T, p *txProbe, h TxHooks) {
	e := doEngine(t, p)
	const k = "unused"
	x, resp := e.Begin(ctx(t), txRequest(k))
	if x == nil {
		t.Fatalf("Begin = %+v; want an execution", resp)
	}
	x.WithInfo(ctx(t))
	_, _ = x.Write([]byte("done"))
	x.Finish(http.StatusCreated, nil)
	if _, resp := e.Begin(ctx(t), txRequest(k)); resp == nil || !resp.IsReplay() || string(resp.Body) != "done" {
		t.Fatalf("retry = %+v; want the replay", resp)
	}
	if n := h.Rows(t, k); n != 0 {
		t.Fatalf("%d rows for an execution that wrote none", n)
	}
}

func testTxConnectionLost(t *testing.T, p *txProbe, h TxHooks) {
	if h.KillConnection == nil {
		return
	}
	var mu sync.Mutex
	var events []idem.EventKind
	e := doEngine(t, p, idem.WithEventHook(func(_ context.Context, ev idem.Event) {
		mu.Lock()
		events = append(events, ev.Kind)
		mu.Unlock()
	}))
	const k = "connection-lost"
	x, hc := begin(t, e, p, h, k)
	h.KillConnection(t, hc)
	_, _ = x.Write([]byte("done"))
	x.Finish(http.StatusCreated, nil)
	if n := h.Rows(t, k); n != 0 {
		t.Fatalf("%d rows committed; want 0 (rolled back with the connection)", n)
	}
	mu.Lock()
	got := slices.Clone(events)
	mu.Unlock()
	if !slices.Contains(got, idem.EventLeaseLost) || slices.Contains(got, idem.EventCompleted) {
		t.Fatalf("events %v; want lease-lost and no completed", got)
	}
	x, resp := e.Begin(ctx(t), txRequest(k))
	if x == nil {
		t.Fatalf("retry = %+v; want an execution at once (the key was released)", resp)
	}
	x.Fail()
}

// testTxConnectionLostJournal is testTxConnectionLost after a step: the
// completion fails, but the record keeps its journal (its lease lapses
// at once instead of a release), so the retry replays the charge.
func testTxConnectionLostJournal(t *testing.T, p *txProbe, h TxHooks) {
	if _, ok := p.Store.(idem.Journal); !ok || h.KillConnection == nil {
		return
	}
	e := doEngine(t, p.Store, idem.WithLease(longLease), idem.WithStoreTimeout(10*time.Second))
	const k = "connection-lost-journal"
	charges := 0
	step := func(c context.Context) (string, error) {
		return idem.Step(c, "charge", func(context.Context) (string, error) {
			charges++
			return "ch_1", nil
		})
	}
	x, resp := e.Begin(ctx(t), txRequest(k))
	if x == nil {
		t.Fatalf("Begin = %+v; want an execution", resp)
	}
	hc := x.WithInfo(ctx(t))
	if _, err := step(hc); err != nil {
		t.Fatalf("step: %v", err)
	}
	if err := h.Write(hc, k); err != nil {
		t.Fatalf("the handler's write: %v", err)
	}
	h.KillConnection(t, hc)
	_, _ = x.Write([]byte("done"))
	x.Finish(http.StatusCreated, nil)
	if n := h.Rows(t, k); n != 0 {
		t.Fatalf("%d rows committed; want 0 (rolled back with the connection)", n)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		x, resp = e.Begin(ctx(t), txRequest(k))
		if x != nil || time.Now().After(deadline) {
			break
		}
	}
	if x == nil {
		t.Fatalf("retry = %+v; want an execution once the kept record's lease lapsed", resp)
	}
	got, err := step(x.WithInfo(ctx(t)))
	if err != nil || got != "ch_1" || charges != 1 {
		t.Fatalf("retry's step = %q, %v after %d charges; want the journaled ch_1, one charge", got, err, charges)
	}
	_, _ = x.Write([]byte("done"))
	x.Finish(http.StatusCreated, nil)
}
