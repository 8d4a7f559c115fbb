package pgstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/stores/pgstore"
)

// Environment of the integration tests.
//
//	IDEM_POSTGRES_URL  a PostgreSQL database the tests may create tables in,
//	                   default postgres://postgres@127.0.0.1:5432/test
//	CI=true            an unreachable server fails the tests instead of
//	                   skipping them
//
// Every table lives in the schema idem_pgtest under a random name and is
// dropped at the end of its test: the server may be shared.
const defaultURL = "postgres://postgres@127.0.0.1:5432/test"

// testSchema holds every table the tests create.
const testSchema = "idem_pgtest"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	goleak.VerifyTestMain(m)
}

func pgURL() string {
	if u := os.Getenv("IDEM_POSTGRES_URL"); u != "" {
		return u
	}
	return defaultURL
}

// unavailable fails the test under CI=true and skips it otherwise.
func unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s (CI=true: failing instead of skipping)", msg)
	}
	tb.Skipf("%s; skipping (set CI=true to fail instead)", msg)
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// newPool returns a pool on IDEM_POSTGRES_URL, closed at the end of the
// test; configure may adjust its configuration first.
func newPool(tb testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	return newPoolURL(tb, pgURL(), configure...)
}

func newPoolURL(tb testing.TB, url string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("IDEM_POSTGRES_URL %q: %v", url, err)
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a refused connection fails at once; a loaded machine may take seconds
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		unavailable(tb, "PostgreSQL unreachable at %s (IDEM_POSTGRES_URL): %v", url, err)
	}
	return pool
}

var (
	schemaOnce sync.Once // concurrent CREATE SCHEMA IF NOT EXISTS may race on the catalog
	schemaErr  error
)

// newTable returns a fresh "idem_pgtest.<random>" table name prefix, whose
// tables (the name itself and name+"_payments") are dropped at the end of
// the test.
func newTable(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	schemaOnce.Do(func() { _, schemaErr = pool.Exec(ctxT(tb), `CREATE SCHEMA IF NOT EXISTS `+testSchema) })
	if schemaErr != nil {
		tb.Fatalf("create schema %s: %v", testSchema, schemaErr)
	}
	name := "t_" + strings.ToLower(rand.Text()[:12])
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, t := range []string{name, name + "_payments"} {
			_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{testSchema, t}.Sanitize())
		}
	})
	return testSchema + "." + name
}

// newStore returns a store on a fresh table of pool, schema ensured.
func newStore(tb testing.TB, pool *pgxpool.Pool, opts ...pgstore.Option) (*pgstore.Store, string) {
	tb.Helper()
	table := newTable(tb, pool)
	s := pgstore.New(pool, append([]pgstore.Option{pgstore.WithTable(table)}, opts...)...)
	if err := s.EnsureSchema(ctxT(tb)); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s, table
}
