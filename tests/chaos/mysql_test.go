package chaos

import (
	"context"
	"database/sql"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// mysqlServer returns the configuration of IDEM_MYSQL_DSN (default
// root@tcp(127.0.0.1:3306)/test) naming a fresh database, and a *sql.DB
// on that database; the example services create it (with idem_records and
// payments) and it is dropped at cleanup. The server itself is shared: the
// scenarios cut connections to it through a proxy, never stop it.
func mysqlServer(t *testing.T) (*mysql.Config, *sql.DB) {
	t.Helper()
	dsn := os.Getenv("IDEM_MYSQL_DSN")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("IDEM_MYSQL_DSN: %v", err)
	}
	cfg.DBName = ""
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		need(t, "MySQL at %s (IDEM_MYSQL_DSN): %v", cfg.Addr, err)
	}
	cfg.DBName = "idem_chaos_" + strings.ToLower(hexID())
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+cfg.DBName+"`"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Exec("DROP DATABASE IF EXISTS `" + cfg.DBName + "`")
		db.Close()
	})
	conn, err = mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	in := sql.OpenDB(conn)
	// No idle connections: each has a driver goroutine (its context
	// watcher) that TestSoak's leak check would find after a query.
	in.SetMaxIdleConns(0)
	t.Cleanup(func() { in.Close() })
	return cfg, in
}

func mysqlBackend(t *testing.T) backend {
	cfg, db := mysqlServer(t)
	return backend{
		name: "mysql",
		addr: cfg.Addr,
		flags: func(hp string) []string {
			c := cfg.Clone()
			c.Addr = hp
			return []string{"-store", "mysql", "-mysql-dsn", c.FormatDSN()}
		},
		inProgress: func(t testing.TB) (int, int) {
			t.Helper()
			var stuck, total int
			// An in-progress record whose lease lapsed is expired, not stuck.
			if err := db.QueryRow(`SELECT COALESCE(SUM(state = 1 AND expires_at > UTC_TIMESTAMP(6)), 0), count(*) FROM idem_records`).Scan(&stuck, &total); err != nil {
				t.Fatal(err)
			}
			return stuck, total
		},
		// database/sql dials a new connection on the next call.
		recovery: 5 * time.Second,
	}
}

// TestMySQLCrashAfterInsert: on mysqlstore, A's payment row was in its
// execution's transaction (mysqlstore.Tx), which the server rolled back
// when A's connection died with it: one row, the retry's.
func TestMySQLCrashAfterInsert(t *testing.T) {
	t.Parallel()
	cfg, db := mysqlServer(t)
	args := []string{"-store", "mysql", "-mysql-dsn", cfg.FormatDSN(),
		"-lease", "2s", "-store-timeout", "500ms", "-charge-latency", "0"} // lease >= 4 × store timeout
	a := startService(t, "nethttp", "", append(args, "-pause-after-record")...)
	b := startService(t, "nethttp", "", args...)
	user, key := "u"+hexID(), newKey()

	first := async(a.URL, user, key, 1000)
	a.waitPaused(1)
	a.kill()
	if ans := <-first; ans.err == nil {
		t.Fatalf("the killed instance answered %v", ans)
	}
	answers := retryUntil(b.URL, user, key, 1000, 50*time.Millisecond, 15*time.Second,
		func(a answer) bool { return a.status != http.StatusConflict })
	won := answers[len(answers)-1]
	if won.status != http.StatusCreated || won.replayed {
		t.Fatalf("retries through B ended with %v; all: %v", won, summary(answers))
	}
	if len(answers) < 2 {
		t.Errorf("the first retry executed at once: A's lease was not live after the kill")
	}
	if replay := pay(b.URL, user, key, 1000); !replay.replayed || replay.id != won.id {
		t.Errorf("retry after B completed: %v id %q; want the replay of %q", replay, replay.id, won.id)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM payments WHERE user_id = ?`, user).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d payment rows after the crash and the retry; want exactly 1", n)
	}
	t.Logf("A killed after writing its row; retries through B: %v; one row", summary(answers))
}
