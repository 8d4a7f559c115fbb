package mysqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/stores/mysqlstore"
)

// Environment of the integration tests.
//
//	IDEM_MYSQL_DSN  a MySQL 8 or MariaDB database the tests may create
//	                tables and procedures in (go-sql-driver DSN), default
//	                root@tcp(127.0.0.1:3306)/test
//
// Every table (and its acquire procedure) gets a random name and is
// dropped at the end of its test: the server may be shared. An
// unreachable server fails the tests.
const defaultDSN = "root@tcp(127.0.0.1:3306)/test"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	goleak.VerifyTestMain(m)
}

func dsn() string {
	if d := os.Getenv("IDEM_MYSQL_DSN"); d != "" {
		return d
	}
	return defaultDSN
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// config parses IDEM_MYSQL_DSN; configure may adjust it.
func config(tb testing.TB, configure ...func(*mysql.Config)) *mysql.Config {
	tb.Helper()
	cfg, err := mysql.ParseDSN(dsn())
	if err != nil {
		tb.Fatalf("IDEM_MYSQL_DSN %q: %v", dsn(), err)
	}
	for _, f := range configure {
		f(cfg)
	}
	return cfg
}

// newDB returns a *sql.DB on IDEM_MYSQL_DSN (at most 16 connections: the
// server is shared), closed at the end of the test.
func newDB(tb testing.TB, configure ...func(*mysql.Config)) *sql.DB {
	tb.Helper()
	return openDB(tb, config(tb, configure...))
}

func openDB(tb testing.TB, cfg *mysql.Config) *sql.DB {
	tb.Helper()
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	tb.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a refused connection fails at once; a loaded machine may take seconds
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		tb.Fatalf("MySQL unreachable at %s (IDEM_MYSQL_DSN; scripts/services.sh starts MariaDB): %v", cfg.Addr, err)
	}
	return db
}

// newTable returns a fresh random table name, whose table, payments table
// (name+"_payments") and acquire procedure are dropped at the end of the
// test.
func newTable(tb testing.TB, db *sql.DB) string {
	tb.Helper()
	name := "idem_t_" + strings.ToLower(rand.Text()[:12])
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, q := range []string{"DROP TABLE IF EXISTS `" + name + "`", "DROP TABLE IF EXISTS `" + name + "_payments`",
			"DROP PROCEDURE IF EXISTS `" + name + "_acquire`", "DROP PROCEDURE IF EXISTS `" + name + mysqlstore.ProcSuffix + "`"} {
			_, _ = db.ExecContext(ctx, q)
		}
	})
	return name
}

// newStore returns a store on a fresh table of db, schema ensured.
func newStore(tb testing.TB, db *sql.DB, opts ...mysqlstore.Option) (*mysqlstore.Store, string) {
	tb.Helper()
	table := newTable(tb, db)
	s := mysqlstore.New(db, append([]mysqlstore.Option{mysqlstore.WithTable(table)}, opts...)...)
	if err := s.EnsureSchema(ctxT(tb)); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s, table
}
