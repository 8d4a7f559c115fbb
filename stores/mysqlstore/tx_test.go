package mysqlstore_test

import (
	"context"
	"sync/atomic"
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mysqlstore"
)

// TestTransactional runs storetest.RunTransactional, the handler writing
// one payment row through Tx, at the default isolation level and at READ
// COMMITTED.
func TestTransactional(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"", "READ-COMMITTED"} {
		t.Run("isolation="+cmpOr(level, "default"), func(t *testing.T) {
			t.Parallel()
			db := newDB(t, isolation(t, level))
			storetest.RunTransactional(t, func(t *testing.T) (idem.Store, storetest.TxHooks) {
				s, table := newStore(t, db)
				payments := createPayments(t, db, table)
				return s, storetest.TxHooks{
					Write: func(ctx context.Context, tag string) error {
						tx, err := mysqlstore.Tx(ctx)
						if err == nil {
							err = insertPayment(ctx, tx, payments, tag)
						}
						return err
					},
					Rows:        func(t *testing.T, tag string) int { return countRows(t, db, payments, tag) },
					Held:        func() int { return db.Stats().InUse },
					NoExecution: mysqlstore.ErrNoExecution,
					Ended:       mysqlstore.ErrExecutionEnded,
					KillConnection: func(t *testing.T, ctx context.Context) {
						tx, err := mysqlstore.Tx(ctx)
						if err != nil {
							t.Fatal(err)
						}
						var id int64
						if err := tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
							t.Fatal(err)
						}
						// KILL returns once the connection is marked killed.
						if _, err := db.ExecContext(ctxT(t), `KILL CONNECTION ?`, id); err != nil {
							t.Fatal(err)
						}
					},
				}
			})
		})
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
	e, err := idem.New(s, countedOptions...)
	if err != nil {
		t.Fatal(err)
	}
	execute := func(key string) {
		t.Helper()
		x, resp := e.Begin(ctxT(t), request(key, `{}`))
		if x == nil {
			t.Fatalf("Begin(%s) = %+v; want an execution", key, resp)
		}
		x.WithInfo(ctxT(t))
		x.Finish(201, nil)
	}
	execute("warm-up")
	n.Store(0)
	execute("k")
	if got := n.Load(); got != 2 {
		t.Fatalf("%d round trips for an execution that never used Tx; want 2", got)
	}
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
