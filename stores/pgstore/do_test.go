package pgstore_test

import (
	"context"
	"errors"
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/pgstore"
)

func TestDo(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	storetest.RunDo(t, func(t *testing.T) idem.Store {
		s, _ := newStore(t, pool)
		return s
	})
}

// TestDoTx: idem.Do's function writes through the execution's transaction
// (pgstore.Tx), which commits with the record: a duplicate adds no row, a
// transient error rolls the write back, a permanent one stores the error
// and rolls the write back too.
func TestDoTx(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s, table := newStore(t, pool)
	outbox := table + "_payments"
	if _, err := pool.Exec(ctxT(t), `CREATE TABLE `+outbox+` (op text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	rows := func(op string) int {
		var n int
		if err := pool.QueryRow(ctxT(t), `SELECT count(*) FROM `+outbox+` WHERE op = $1`, op).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	send := func(op string, fail error) func(ctx context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			tx, err := pgstore.Tx(ctx)
			if err != nil {
				return "", err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+outbox+` (op) VALUES ($1)`, op); err != nil {
				return "", err
			}
			return "sent " + op, fail
		}
	}
	ok := idem.Operation{Name: "receipt", Key: "k-ok"}
	for range 3 {
		if v, err := idem.Do(ctxT(t), e, ok, send("ok", nil)); err != nil || v != "sent ok" {
			t.Fatalf("Do: %q, %v", v, err)
		}
	}
	if n := rows("ok"); n != 1 {
		t.Fatalf("%d outbox rows after three calls, want 1", n)
	}

	transient := idem.Operation{Name: "receipt", Key: "k-transient"}
	boom := errors.New("downstream timeout")
	if _, err := idem.Do(ctxT(t), e, transient, send("transient", boom)); !errors.Is(err, boom) {
		t.Fatalf("got %v, want %v", err, boom)
	}
	if n := rows("transient"); n != 0 {
		t.Fatalf("%d rows after a transient error, want the write rolled back", n)
	}
	if _, err := idem.Do(ctxT(t), e, transient, send("transient", nil)); err != nil {
		t.Fatal(err)
	}
	if n := rows("transient"); n != 1 {
		t.Fatalf("%d rows after the retry, want 1", n)
	}

	permanent := idem.Operation{Name: "receipt", Key: "k-permanent"}
	for range 2 {
		if _, err := idem.Do(ctxT(t), e, permanent, send("permanent", idem.Permanent(boom))); !errors.Is(err, idem.ErrPermanent) {
			t.Fatalf("got %v, want a permanent error", err)
		}
	}
	if n := rows("permanent"); n != 1 {
		t.Fatalf("%d rows after a permanent error, want 1 (stored with the record, as a 422 response is)", n)
	}
}
