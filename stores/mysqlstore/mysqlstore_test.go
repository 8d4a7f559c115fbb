package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mysqlstore"
)

// TestConformance runs the store suite at the server's default isolation
// level (REPEATABLE READ on MySQL and MariaDB), with every session at READ
// COMMITTED, and with the DSN's clientFoundRows (affected rows count the
// rows matched, not changed).
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, level string }{{"isolation=default", ""}, {"isolation=read-committed", "READ-COMMITTED"}, {"clientFoundRows", ""}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			level := c.level
			db := newDB(t, isolation(t, level), func(cfg *mysql.Config) { cfg.ClientFoundRows = c.name == "clientFoundRows" })
			want := cmpOr(level, "REPEATABLE-READ")
			var got string
			if err := db.QueryRowContext(ctxT(t), `SELECT @@`+isolationVar(t)).Scan(&got); err != nil || got != want {
				t.Fatalf("session isolation = %q, %v; want %s", got, err, want)
			}
			storetest.Run(t, func(t *testing.T) idem.Store {
				s, _ := newStore(t, db)
				return s
			})
			t.Run("Journal", func(t *testing.T) {
				storetest.RunJournal(t, func(t *testing.T) idem.Store {
					s, _ := newStore(t, db)
					return s
				})
			})
			t.Run("Recovery", func(t *testing.T) {
				// 10,000 completed records take about 30s per configuration
				// here under -race on a loaded 2-core machine: 2,000 at the
				// default isolation, 500 in the other two (the due_at index
				// is the same in all three).
				history := 500
				if c.name == "isolation=default" {
					history = 2_000
				}
				storetest.RunRecovery(t, func(t *testing.T) idem.Store {
					s, _ := newStore(t, db)
					return s
				}, storetest.WithHistory(history))
			})
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

var (
	isoVarOnce sync.Once
	isoVar     string
)

// isolationVar is the session variable holding the isolation level:
// transaction_isolation (MySQL 5.7.20+, MariaDB 11.1+) or tx_isolation
// (MariaDB before 11.1).
func isolationVar(t *testing.T) string {
	isoVarOnce.Do(func() {
		db := newDB(t)
		isoVar = "transaction_isolation"
		var v string
		if err := db.QueryRowContext(ctxT(t), `SELECT @@transaction_isolation`).Scan(&v); err != nil {
			isoVar = "tx_isolation"
		}
	})
	return isoVar
}

// isolation sets every session's isolation level (none for "").
func isolation(t *testing.T, level string) func(*mysql.Config) {
	v := isolationVar(t)
	return func(c *mysql.Config) {
		if level == "" {
			return
		}
		if c.Params == nil {
			c.Params = map[string]string{}
		}
		c.Params[v] = "'" + level + "'"
	}
}

// countingConn counts the writes a connection sends: the driver writes
// each command (a statement execution, with its parameters) in one write
// and then waits for the answer, so writes are round trips.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

func countRoundTrips(n *atomic.Int64) func(*mysql.Config) {
	return func(cfg *mysql.Config) {
		d := &net.Dialer{}
		cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{c, n}, nil
		}
	}
}

// countedOptions configure the engines whose round trips are counted: no
// lease renewal falls due and no store call times out (and is answered
// 503) however slow a loaded machine makes the test; the count is the
// execution's own statements.
var countedOptions = []idem.Option{idem.WithLease(time.Hour), idem.WithStoreTimeout(time.Minute)}

func request(key, body string) *idem.Request {
	return &idem.Request{Method: "POST", Path: "/v1/payments", ContentType: "application/json",
		Keys: []string{key}, Principal: "alice", Body: []byte(body)}
}

// createPayments creates the application's table next to the records.
func createPayments(t testing.TB, db *sql.DB, table string) string {
	t.Helper()
	payments := table + "_payments"
	if _, err := db.ExecContext(ctxT(t), "CREATE TABLE `"+payments+"` (id BIGINT AUTO_INCREMENT PRIMARY KEY, idem_key VARCHAR(255) NOT NULL, amount INT NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	return payments
}

func countRows(t testing.TB, db *sql.DB, payments, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctxT(t), "SELECT count(*) FROM `"+payments+"` WHERE idem_key = ?", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func insertPayment(ctx context.Context, tx *sql.Tx, payments, key string) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO `"+payments+"` (idem_key, amount) VALUES (?, 4200)", key)
	return err
}

func TestRoundTrips(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	db := newDB(t, countRoundTrips(&n))
	db.SetMaxOpenConns(2) // every connection warmed up below
	s, table := newStore(t, db)
	payments := createPayments(t, db, table)
	e, err := idem.New(s, countedOptions...)
	if err != nil {
		t.Fatal(err)
	}
	execute := func(key, body string, tx bool) {
		t.Helper()
		x, resp := e.Begin(ctxT(t), request(key, body))
		if x == nil {
			t.Fatalf("Begin(%s) = %+v; want execution", key, resp)
		}
		if tx {
			ctx := x.WithInfo(ctxT(t))
			tx, err := mysqlstore.Tx(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := insertPayment(ctx, tx, payments, key); err != nil {
				t.Fatal(err)
			}
		}
		x.Write([]byte(`{"id":"pay_1"}`))
		x.Finish(201, http.Header{"Content-Type": {"application/json"}})
	}
	expect := func(what string, want int64, f func()) {
		t.Helper()
		n.Store(0)
		f()
		if got := n.Load(); got != want {
			t.Errorf("%s: %d round trips; want %d", what, got, want)
		} else {
			t.Logf("%s: %d round trip(s)", what, got)
		}
	}
	// Warm-up: both connections dialled, every statement prepared on each
	// (database/sql prepares a statement once per connection).
	for i := range 6 {
		k := fmt.Sprintf("warm-up-%d", i)
		execute(k, `{"amount":1}`, i%2 == 0)
		e.Begin(ctxT(t), request(k, `{"amount":1}`))
		e.Begin(ctxT(t), request(k, `{"amount":2}`))
		if x, _ := e.Begin(ctxT(t), request(k+"-fail", `{}`)); x != nil {
			x.Fail()
		}
	}

	expect("first execution (Begin+Finish)", 2, func() { execute("k1", `{"amount":100}`, false) })
	expect("replay", 1, func() {
		if _, resp := e.Begin(ctxT(t), request("k1", `{"amount":100}`)); resp == nil || resp.Status != 201 || !resp.IsReplay() {
			t.Fatalf("replay = %+v", resp)
		}
	})
	expect("422 mismatch", 1, func() {
		if _, resp := e.Begin(ctxT(t), request("k1", `{"amount":999}`)); resp == nil || resp.Status != 422 {
			t.Fatalf("mismatch = %+v", resp)
		}
	})
	x, _ := e.Begin(ctxT(t), request("k2", `{"amount":5}`))
	if x == nil {
		t.Fatal("Begin k2: no execution")
	}
	expect("409 conflict", 1, func() {
		if _, resp := e.Begin(ctxT(t), request("k2", `{"amount":5}`)); resp == nil || resp.Status != 409 {
			t.Fatalf("conflict = %+v", resp)
		}
	})
	expect("Fail (release)", 1, x.Fail)
	// acquire, START TRANSACTION, the handler's INSERT (prepare, execute
	// and a COM_STMT_CLOSE the server does not answer: 3 writes, 2 round
	// trips, for a statement with arguments not prepared beforehand),
	// completion UPDATE, COMMIT: 7 writes, 6 round trips.
	expect("transactional execution with one handler write (writes)", 7, func() { execute("k3", `{"amount":7}`, true) })
	if got := countRows(t, db, payments, "k3"); got != 1 {
		t.Fatalf("%d payment rows for k3; want 1", got)
	}
}
