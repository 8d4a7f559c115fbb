package outboxtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/outbox"
)

var (
	soak = flag.Bool("soak", false, "play the long runs: the cluster chaos and 10,000 messages through the relay on each broker (make soak)")
	seed = flag.Int64("seed", 1, "seed of the chaos runs' choices (which payments roll back, where processes are killed)")
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(child(role))
	}
	goleak.VerifyTestMain(m,
		// pgx's stdlib driver keeps no goroutine; database/sql's opener
		// goroutine ends with DB.Close, the nats.go ones with Conn.Close.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func pgURL() string    { return env("IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test") }
func mysqlDSN() string { return env("IDEM_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test") }
func amqpURL() string  { return env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/") }

// uniq returns a name unique to this run: prefix, "outbox" and a random suffix.
func uniq(prefix string) string {
	return prefix + "_outbox_" + strings.ToLower(rand.Text()[:8])
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// openDB opens dialect's test database with database/sql; PostgreSQL
// through a pgx pool (stdlib.OpenDBFromPool), returned too.
func openDB(t testing.TB, d outbox.Dialect) (*sql.DB, *pgxpool.Pool) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	switch d {
	case outbox.PostgreSQL:
		pool, err := pgxpool.New(ctx, pgURL())
		if err == nil {
			err = pool.Ping(ctx)
		}
		if err != nil {
			t.Fatalf("PostgreSQL at %s: %v (scripts/services.sh starts one)", pgURL(), err)
		}
		db := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { _ = db.Close(); pool.Close() })
		return db, pool
	default:
		cfg, err := mysql.ParseDSN(mysqlDSN())
		if err != nil {
			t.Fatalf("IDEM_MYSQL_DSN %q: %v", mysqlDSN(), err)
		}
		cfg.ParseTime = false // the relay reads created_at without the driver's parseTime (the services' own DSNs)
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(conn)
		db.SetMaxOpenConns(16) // the server is shared
		if err == nil {
			err = db.PingContext(ctx)
		}
		if err != nil {
			t.Fatalf("MariaDB at %s: %v (scripts/services.sh starts one)", mysqlDSN(), err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db, nil
	}
}

// newOutbox creates a fresh outbox table on db, dropped at the end.
func newOutbox(t testing.TB, db *sql.DB, d outbox.Dialect, opts ...outbox.Option) *outbox.Outbox {
	t.Helper()
	name := uniq("t")
	ob, err := outbox.New(d, append([]outbox.Option{outbox.WithTable(name)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.EnsureSchema(ctxT(t, 30*time.Second), db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropTables(db, name, name+"_partitions") })
	return ob
}

func dropTables(db *sql.DB, names ...string) {
	for _, n := range names {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+n)
	}
}

// paymentIDs returns n payment ids unique to this run.
func paymentIDs(n int) []string {
	stamp := strings.ToLower(rand.Text()[:6])
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("pay_%s_%05d", stamp, i)
	}
	return ids
}

// waitFor polls cond until it holds; the deadline is a hang guard only.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
