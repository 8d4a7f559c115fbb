package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/examples/internal/procs"
)

// TestPaymentsServiceNATS and TestPaymentsServiceAMQP run the payments
// service (examples/payments -store postgres -outbox URL) and this consumer
// on its stream or queue: every payment made, some retried with their
// Idempotency-Key, yields exactly one receipt, also across a SIGKILL of the
// service right after its last commits (their events still in the outbox,
// or published and not yet marked sent) and its restart.
func TestPaymentsServiceNATS(t *testing.T) {
	testPaymentsService(t, "nats", env("IDEM_NATS_URL", "nats://127.0.0.1:4222"), "postgres")
}

func TestPaymentsServiceAMQP(t *testing.T) {
	testPaymentsService(t, "amqp", env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "postgres")
}

// TestPaymentsServiceMySQL does the same with -store mysql (the ledger
// and the outbox in a database of the test's own), to NATS.
func TestPaymentsServiceMySQL(t *testing.T) {
	testPaymentsService(t, "nats", env("IDEM_NATS_URL", "nats://127.0.0.1:4222"), "mysql")
}

func testPaymentsService(t *testing.T, broker, url, store string) {
	w := newWorld(t, broker)
	args := []string{"-framework", "nethttp", "-store", store, "-charge-latency", "1ms", "-outbox", url, "-outbox-name", w.name}
	var unsent func() int // events not marked sent
	switch store {
	case "postgres":
		args = append(args, "-postgres-url", env("IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test"), "-postgres-schema", w.name)
		t.Cleanup(func() {
			ctx := context.Background()
			_, _ = w.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{w.name}.Sanitize()+` CASCADE`)
			for _, table := range []string{w.name + "_events", w.name + "_events_partitions"} {
				_, _ = w.pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{table}.Sanitize())
			}
		})
		unsent = func() int {
			var n int
			if err := w.pool.QueryRow(ctxT(t), `SELECT count(*) FROM `+pgx.Identifier{w.name + "_events"}.Sanitize()+` WHERE sent_at IS NULL`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
	case "mysql":
		cfg, err := mysql.ParseDSN(env("IDEM_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.DBName = w.name // created by the service
		args = append(args, "-mysql-dsn", cfg.FormatDSN())
		cfg.DBName = ""
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = db.Exec("DROP DATABASE IF EXISTS `" + w.name + "`"); _ = db.Close() })
		unsent = func() int {
			var n int
			if err := db.QueryRowContext(ctxT(t), "SELECT count(*) FROM `"+w.name+"`.`"+w.name+"_events` WHERE sent_at IS NULL").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	logs, err := os.Create(w.logs + ".payments")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = logs.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("payments service logs:\n%s", b)
		}
	})
	start := func() *procs.Proc {
		svc, err := procs.Start(paymentsBin, logs, args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(svc.Kill)
		return svc
	}
	consumer := w.start()

	var keys, ids []string // one per payment made
	pay := func(svc *procs.Proc, key string) string {
		t.Helper()
		id := charge(t, svc.URL, key)
		if i := slices.Index(keys, key); i >= 0 {
			if ids[i] != id {
				t.Fatalf("retry of %s answered payment %s, first %s", key, id, ids[i])
			}
			return id
		}
		keys, ids = append(keys, key), append(ids, id)
		return id
	}
	a := start()
	for i := range 8 {
		key := rand.Text()
		pay(a, key)
		if i%3 == 0 {
			pay(a, key) // a client's retry: replayed, no second payment
		}
	}
	w.waitReceipts(1) // the relay publishes
	for range 6 {
		pay(a, rand.Text())
	}
	a.Kill() // right after the last commits: their events are in the outbox, relayed or not
	unsentAtKill := unsent()

	b := start()
	for _, key := range slices.Clone(keys[len(keys)-4:]) {
		pay(b, key) // retries after the crash: replayed from PostgreSQL
	}
	for range 6 {
		pay(b, rand.Text())
	}
	w.waitReceipts(len(ids))
	waitFor(t, "every event sent", func() bool { return unsent() == 0 })
	b.Stop() // SIGTERM: the relay stops with the service
	if err := b.Exit(); err != nil {
		t.Errorf("payments service after SIGTERM: %v", err)
	}
	consumer.stop()
	w.drain()

	total, distinct := w.count()
	t.Logf("%s, %s: %d receipts for %d payments (%d events unsent at the SIGKILL)", store, broker, total, distinct, unsentAtKill)
	if total != len(ids) || distinct != len(ids) {
		t.Fatalf("%d receipts for %d distinct payments, want exactly %d", total, distinct, len(ids))
	}
	rows, err := w.pool.Query(ctxT(t), `SELECT payment_id FROM `+pgx.Identifier{w.name + "_outbox"}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(ids))
	if !slices.Equal(got, want) {
		t.Fatalf("receipts for %v, want the payments made %v", got, want)
	}
}

// charge makes a payment through the service's HTTP contract and returns
// its id.
func charge(t *testing.T, base, key string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, base+"/v1/payments", bytes.NewReader([]byte(`{"amount":1200,"currency":"eur"}`)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", "alice")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || resp.StatusCode != http.StatusCreated || p.ID == "" {
		t.Fatalf("POST /v1/payments: %s, %v, id %q", resp.Status, err, p.ID)
	}
	return p.ID
}
