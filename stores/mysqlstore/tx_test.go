package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mysqlstore"
)

// TestTransactional checks what the engine does with the execution's
// transaction: committed with a stored response, rolled back when the
// key is released (5xx, handler error, panic before a response) or the
// lease was lost, and closed to the handler once the execution ended. It
// runs at the default isolation level and at READ COMMITTED.
func TestTransactional(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"", "READ-COMMITTED"} {
		t.Run("isolation="+cmpOr(level, "default"), func(t *testing.T) {
			t.Parallel()
			testTransactional(t, newDB(t, isolation(t, level)))
		})
	}
}

func testTransactional(t *testing.T, db *sql.DB) {
	s, table := newStore(t, db)
	payments := createPayments(t, db, table)
	// Long enough for a loaded machine: it is never renewed here.
	const lease = 3 * time.Second
	noRenewal := struct { // no Extender: the lease is never renewed
		idem.Store
		idem.Transactional
	}{s, s}
	e, err := idem.New(noRenewal, idem.WithLease(lease), idem.WithStoreTimeout(lease/4))
	if err != nil {
		t.Fatal(err)
	}
	// run executes key, inserting one payment row through Tx, then ends
	// with end.
	run := func(key string, end func(*idem.Execution)) {
		t.Helper()
		x, resp := e.Begin(ctxT(t), request(key, `{"amount":1}`))
		if x == nil {
			t.Fatalf("Begin(%s) = %+v; want an execution", key, resp)
		}
		ctx := x.WithInfo(ctxT(t))
		tx, err := mysqlstore.Tx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if again, err := mysqlstore.Tx(ctx); err != nil || again != tx {
			t.Fatalf("second Tx = %v, %v; want the same transaction", again, err)
		}
		if err := insertPayment(ctx, tx, payments, key); err != nil {
			t.Fatal(err)
		}
		if n := countRows(t, db, payments, key); n != 0 {
			t.Fatalf("%s: the uncommitted row is visible outside the transaction (%d)", key, n)
		}
		end(x)
		if _, err := mysqlstore.Tx(ctx); !errors.Is(err, mysqlstore.ErrExecutionEnded) {
			t.Fatalf("Tx after the execution ended = %v; want ErrExecutionEnded", err)
		}
	}
	finish := func(status int) func(*idem.Execution) {
		return func(x *idem.Execution) { x.Write([]byte("done")); x.Finish(status, nil) }
	}
	run("stored", finish(201))
	run("client-error", finish(400))
	run("server-error", finish(503))
	run("handler-error", (*idem.Execution).Fail)
	run("panic", func(x *idem.Execution) { x.Abort(0, nil) })
	run("lease-lost", func(x *idem.Execution) {
		time.Sleep(lease + 100*time.Millisecond)
		// Another instance takes the lapsed lease over and completes.
		if _, ok, err := s.Acquire(ctxT(t), idem.ScopedKey("alice", "POST", "/v1/payments", "lease-lost"), "takeover",
			idem.Fingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"amount":1}`)), time.Minute); err != nil || !ok {
			t.Fatalf("takeover = %v, %v", ok, err)
		}
		x.Finish(201, nil)
	})
	for key, want := range map[string]int{"stored": 1, "client-error": 1, "server-error": 0, "handler-error": 0, "panic": 0, "lease-lost": 0} {
		if n := countRows(t, db, payments, key); n != want {
			t.Errorf("%s: %d payment rows; want %d", key, n, want)
		}
	}
	if _, resp := e.Begin(ctxT(t), request("stored", `{"amount":1}`)); resp == nil || !resp.IsReplay() || string(resp.Body) != "done" {
		t.Fatalf("retry of the stored execution = %+v; want its replay", resp)
	}
	for _, k := range []string{"server-error", "handler-error", "panic"} {
		if x, resp := e.Begin(ctxT(t), request(k, `{"amount":1}`)); x == nil {
			t.Errorf("retry of %s = %+v; want an execution (the key was released)", k, resp)
		} else {
			x.Fail()
		}
	}
	if _, err := mysqlstore.Tx(ctxT(t)); !errors.Is(err, mysqlstore.ErrNoExecution) {
		t.Fatalf("Tx outside an execution = %v; want ErrNoExecution", err)
	}
	if st := db.Stats(); st.InUse != 0 {
		t.Fatalf("%d connections still in use after every execution ended", st.InUse)
	}
}

// A handler that never asks for its transaction costs no BEGIN: the
// completion is the plain conditional UPDATE.
func TestTransactionalUnused(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	db := newDB(t, countRoundTrips(&n))
	db.SetMaxOpenConns(1)
	s, _ := newStore(t, db)
	e, err := idem.New(s)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := e.Begin(ctxT(t), request("warm-up", `{}`))
	x.WithInfo(ctxT(t))
	x.Finish(201, nil)
	n.Store(0)
	x, _ = e.Begin(ctxT(t), request("k", `{}`))
	x.WithInfo(ctxT(t))
	x.Finish(201, nil)
	if got := n.Load(); got != 2 {
		t.Fatalf("%d round trips for an execution that never used Tx; want 2", got)
	}
}

// TestTransactionalConnectionLost: the execution's connection dies before
// its completion (KILL from another session): the completion fails, the
// handler's writes are gone with the transaction, the engine does not
// store the response (lease-lost event), and the key is released so a
// retry executes at once.
func TestTransactionalConnectionLost(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	s, table := newStore(t, db)
	payments := createPayments(t, db, table)
	var mu sync.Mutex
	var events []idem.EventKind
	e, err := idem.New(s, idem.WithEventHook(func(_ context.Context, ev idem.Event) {
		mu.Lock()
		events = append(events, ev.Kind)
		mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	x, _ := e.Begin(ctxT(t), request("lost", `{"amount":1}`))
	if x == nil {
		t.Fatal("Begin: no execution")
	}
	ctx := x.WithInfo(ctxT(t))
	tx, err := mysqlstore.Tx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := insertPayment(ctx, tx, payments, "lost"); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctxT(t), `KILL CONNECTION ?`, id); err != nil {
		t.Fatal(err)
	}
	x.Write([]byte("ok"))
	x.Finish(201, nil)

	if n := countRows(t, db, payments, "lost"); n != 0 {
		t.Fatalf("%d payment rows; want 0 (rolled back with the connection)", n)
	}
	mu.Lock()
	got := slices.Clone(events)
	mu.Unlock()
	if !slices.Contains(got, idem.EventLeaseLost) || slices.Contains(got, idem.EventCompleted) {
		t.Fatalf("events %v; want lease-lost and no completed", got)
	}
	x2, resp := e.Begin(ctxT(t), request("lost", `{"amount":1}`))
	if x2 == nil {
		t.Fatalf("retry = %+v; want an execution at once (the key was released)", resp)
	}
	x2.Fail()
}

// TestTransactionalHandlerCommits: a handler that commits the execution's
// transaction itself (which a *sql.Tx cannot refuse) keeps its writes,
// and the record is completed on its own, so retries replay instead of
// executing a second time.
func TestTransactionalHandlerCommits(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	s, table := newStore(t, db)
	payments := createPayments(t, db, table)
	e, err := idem.New(s)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := e.Begin(ctxT(t), request("self", `{"amount":1}`))
	ctx := x.WithInfo(ctxT(t))
	tx, err := mysqlstore.Tx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := insertPayment(ctx, tx, payments, "self"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	x.Write([]byte("ok"))
	x.Finish(201, nil)
	if n := countRows(t, db, payments, "self"); n != 1 {
		t.Fatalf("%d payment rows; want the handler's committed 1", n)
	}
	if _, resp := e.Begin(ctxT(t), request("self", `{"amount":1}`)); resp == nil || !resp.IsReplay() {
		t.Fatalf("retry = %+v; want a replay", resp)
	}
}
