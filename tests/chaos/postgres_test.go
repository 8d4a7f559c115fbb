package chaos

import (
	"context"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The crash proof of transactional completion (stores/pgstore): the
// payments example records each payment as a row in PostgreSQL, through the
// execution's transaction with -store postgres, on its own connection
// (autocommit) with any other store. -pause-after-record holds the handler
// after its row is written (it prints "paused"), until SIGUSR1 or a kill.

// pgDatabase returns IDEM_POSTGRES_URL and a fresh schema for the
// example's tables (idem_records, payments), dropped at cleanup.
func pgDatabase(t *testing.T) (url, schema string, pool *pgxpool.Pool) {
	t.Helper()
	url = os.Getenv("IDEM_POSTGRES_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(context.Background(), url)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		need(t, "PostgreSQL at %s (IDEM_POSTGRES_URL): %v", url, err)
	}
	schema = "idem_chaos_" + strings.ToLower(hexID())
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
		pool.Close()
	})
	return url, schema, pool
}

// paymentRows counts the payment rows of user in schema.
func paymentRows(t *testing.T, pool *pgxpool.Pool, schema, user string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{schema, "payments"}.Sanitize()+` WHERE user_id = $1`, user).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// crashAfterRecord runs instance A with -pause-after-record, SIGKILLs it
// once its payment row is written, retries through instance B until it
// executes, and returns the payment rows for the key.
func crashAfterRecord(t *testing.T, store []string) int {
	pgURL, schema, pool := pgDatabase(t)
	args := append(store, "-postgres-url", pgURL, "-postgres-schema", schema, "-payments-postgres",
		"-lease", "2s", "-store-timeout", "500ms", "-charge-latency", "0") // lease >= 4 × store timeout
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
	t.Logf("A killed after writing its row; retries through B: %v", summary(answers))
	return paymentRows(t, pool, schema, user)
}

// TestPostgresCrashAfterInsert: on pgstore, A's row was in its execution's
// transaction, which died with its connection: one row, the retry's.
func TestPostgresCrashAfterInsert(t *testing.T) {
	t.Parallel()
	if n := crashAfterRecord(t, []string{"-store", "postgres"}); n != 1 {
		t.Fatalf("%d payment rows after the crash and the retry; want exactly 1", n)
	}
}

// TestRedisCrashAfterInsert is the same crash with the idempotency records
// in Redis: A's row was committed on its own, and the retry adds a second
// one. This is the window transactional completion closes; the test pins
// it down so the comparison stays true.
func TestRedisCrashAfterInsert(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	if n := crashAfterRecord(t, []string{"-store", "redis", "-redis-url", "redis://" + r.Addr() + "/0"}); n != 2 {
		t.Fatalf("%d payment rows after the crash and the retry on Redis; want 2 (the documented window)", n)
	}
}

// TestPostgresSlowHandlerWithoutRenewal: A's handler outlives its lease
// with renewal disabled; B takes the key over and executes; then A goes on
// and its commit is refused: one row, B's, and retries replay B's payment.
func TestPostgresSlowHandlerWithoutRenewal(t *testing.T) {
	t.Parallel()
	pgURL, schema, pool := pgDatabase(t)
	args := []string{"-store", "postgres", "-postgres-url", pgURL, "-postgres-schema", schema,
		"-lease", "2s", "-store-timeout", "500ms", "-no-renewal", "-charge-latency", "0"}
	a := startService(t, "nethttp", "", append(args, "-pause-after-record")...)
	b := startService(t, "nethttp", "", args...)
	user, key := "u"+hexID(), newKey()

	first := async(a.URL, user, key, 1000)
	a.waitPaused(1)
	answers := retryUntil(b.URL, user, key, 1000, 50*time.Millisecond, 15*time.Second,
		func(a answer) bool { return a.status != http.StatusConflict })
	won := answers[len(answers)-1]
	if won.status != http.StatusCreated || won.replayed {
		t.Fatalf("takeover through B ended with %v; all: %v", won, summary(answers))
	}
	if err := a.cmd.Process.Signal(syscall.SIGUSR1); err != nil { // A's handler goes on, long after its lease
		t.Fatal(err)
	}
	late := <-first
	if n := paymentRows(t, pool, schema, user); n != 1 {
		t.Fatalf("%d payment rows after A's late completion; want 1 (A's commit refused)", n)
	}
	if replay := pay(a.URL, user, key, 1000); !replay.replayed || replay.id != won.id {
		t.Fatalf("retry through A: %v id %q; want the replay of B's %q", replay, replay.id, won.id)
	}
	t.Logf("B took over after %v; A's late answer %v (its client was told %q, a payment whose row was rolled back); one row, B's %q",
		summary(answers), late, late.id, won.id)
	if n := b.stop(); n != 1 {
		t.Errorf("B executed %d times, want 1", n)
	}
}
