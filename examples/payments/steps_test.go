package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/payments"
	"github.com/idemkit/idem/examples/internal/procs"
)

// crashOutcome is what a payment cut at a pause point ends as, once retried.
type crashOutcome struct {
	status  int   // the final answer: 201, or 409 operation-uncertain
	charges int64 // real charges at the provider
	emails  int64 // receipts sent
}

// crashOutcomes: a step finished or cut inside a repeatable call resumes
// to exactly one charge and one receipt; a receipt cut mid-step has an
// unknown outcome, so the key ends uncertain, without a second charge (and
// the mail sent or not, as far as the crash let it).
var crashOutcomes = map[string]crashOutcome{
	"before-charge":       {http.StatusCreated, 1, 1},
	"charge-before-call":  {http.StatusCreated, 1, 1},
	"charge-after-call":   {http.StatusCreated, 1, 1},
	"receipt-before-call": {http.StatusConflict, 1, 0},
	"receipt-after-call":  {http.StatusConflict, 1, 1},
	"after-steps":         {http.StatusCreated, 1, 1},
	"before-completion":   {http.StatusCreated, 1, 1},
}

// TestCrashPoints SIGKILLs the payments service (-provider-url, lease 2s)
// at every pause point of a payment, restarts it and retries the payment
// with its idempotency key until a final answer, on every shared store
// (Redis, MongoDB wire, PostgreSQL, MySQL): the
// card provider (its own process, one per store) counts exactly one charge
// per payment, one receipt and, on the SQL stores, one ledger row; or,
// where the receipt step was cut, 409 operation-uncertain, one charge and
// no ledger row. A declined charge cut after the provider's answer is
// declined again under the same key (402, nothing charged). The control,
// -no-steps cut after the charge, charges twice.
func TestCrashPoints(t *testing.T) {
	if len(crashOutcomes) != len(payments.PausePoints) {
		t.Fatalf("crashOutcomes has %d points, payments.PausePoints %d", len(crashOutcomes), len(payments.PausePoints))
	}
	bin, provider := buildCrashBinaries(t)
	stores := []string{"redis", "mongo", "postgres", "mysql"}
	var wg sync.WaitGroup // all stores at once: each mostly waits for a lease to lapse
	for _, store := range stores {
		wg.Go(func() {
			t.Run(store, func(t *testing.T) {
				env := newCrashEnv(t, store, bin, provider)
				for _, point := range payments.PausePoints {
					want := crashOutcomes[point]
					got, rows := env.crash(t, point, amount, false)
					if got != want {
						t.Errorf("%s: %+v, want %+v", point, got, want)
					}
					if wantRows := int64(0); env.rows != nil {
						if want.status == http.StatusCreated {
							wantRows = 1
						}
						if rows != wantRows {
							t.Errorf("%s: %d ledger rows, want %d", point, rows, wantRows)
						}
					}
				}
				got, rows := env.crash(t, "charge-after-call", payments.AmountDeclined, false)
				if want := (crashOutcome{http.StatusPaymentRequired, 0, 0}); got != want || rows != 0 {
					t.Errorf("declined, charge-after-call: %+v and %d ledger rows, want %+v and none", got, rows, want)
				}
				// The control: without steps the re-run charges again.
				got, _ = env.crash(t, "charge-after-call", amount, true)
				if want := (crashOutcome{http.StatusCreated, 2, 1}); got != want {
					t.Errorf("-no-steps, charge-after-call: %+v, want %+v (the provider charged twice)", got, want)
				}
			})
		})
	}
	wg.Wait()
}

// TestFencing runs two instances on one PostgreSQL store: A is held after
// the provider charged, then stalled (SIGSTOP) past its lease; B takes the
// retry over and completes it. Resumed, A cannot journal its charge step
// nor complete: its request fails, B's payment is the one replayed, and
// the provider charged once.
func TestFencing(t *testing.T) {
	bin, provider := buildCrashBinaries(t)
	env := newCrashEnv(t, "postgres", bin, provider)
	user, key := "fence-"+rand.Text()[:8], rand.Text()
	a := env.start(t, "-pause-at", "charge-after-call")
	b := env.start(t)
	aDone := make(chan int, 1)
	go func() { status, _, _ := send(a.URL, user, key, amount); aDone <- status }()
	if _, err := a.Line("paused at charge-after-call"); err != nil {
		t.Fatal(err)
	}
	if err := a.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	status, body := retry(t, b.URL, user, key, amount) // 409 until A's lease lapses, then B takes over
	if status != http.StatusCreated {
		t.Fatalf("B: %d %s, want 201", status, body)
	}
	var paid payments.Payment
	if err := json.Unmarshal(body, &paid); err != nil {
		t.Fatal(err)
	}
	if err := a.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := a.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	select {
	case status := <-aDone:
		if status == http.StatusCreated {
			t.Errorf("A, resumed after losing its lease, answered 201: it completed")
		}
		t.Logf("A, resumed after losing its lease, answered %d", status)
	case <-time.After(60 * time.Second):
		t.Fatal("A did not answer in 60s after SIGCONT")
	}
	for _, p := range []*procs.Proc{a, b} {
		status, h, body := send(p.URL, user, key, amount)
		var again payments.Payment
		_ = json.Unmarshal(body, &again)
		if status != http.StatusCreated || h.Get(idem.ReplayedHeader) != "true" || again.ID != paid.ID {
			t.Errorf("retry after both: %d %s (replayed %q), want B's payment %s replayed", status, body, h.Get(idem.ReplayedHeader), paid.ID)
		}
	}
	st := env.stats(t)
	if st.Charges != 1 || st.Emails != 1 {
		t.Errorf("provider: %+v, want 1 charge and 1 receipt", st)
	}
	if n := env.rows(t, user); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
}

// buildCrashBinaries builds the payments service and the card provider.
func buildCrashBinaries(t *testing.T) (bin, provider string) {
	t.Helper()
	dir := t.TempDir()
	bin, err := procs.Build(context.Background(), dir, "payments")
	if err != nil {
		t.Fatal(err)
	}
	provider, err = procs.Build(context.Background(), dir, "cardprovider")
	if err != nil {
		t.Fatal(err)
	}
	return bin, provider
}

// crashEnv is one store with its own card provider.
type crashEnv struct {
	bin      string
	args     []string // the service's flags: store and provider
	provider string   // the card provider's URL
	logs     *os.File
	// cfg names the store as args do, for payments.OpenStore.
	cfg payments.Config
	// rows counts user's ledger rows (SQL stores), nil for the others.
	rows func(t *testing.T, user string) int64
}

func newCrashEnv(t *testing.T, store, bin, providerBin string, providerArgs ...string) *crashEnv {
	t.Helper()
	logs, err := os.Create(filepath.Join(t.TempDir(), "logs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("logs:\n%s", b)
		}
		logs.Close()
	})
	provider, err := procs.Start(providerBin, logs, providerArgs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(provider.Stop)
	env := &crashEnv{bin: bin, provider: provider.URL, logs: logs,
		args: []string{"-framework", "nethttp", "-store", store, "-lease", "2s", "-store-timeout", "500ms", "-provider-url", provider.URL}}
	suffix := strings.ToLower(rand.Text()[:10])
	ctx := context.Background()
	env.cfg.Store = store
	switch store {
	case "redis":
		url, prefix := envOr("IDEM_REDIS_URL", "redis://127.0.0.1:6379/0"), "idemtest:steps:"+suffix+":"
		env.args = append(env.args, "-redis-url", url, "-redis-prefix", prefix)
		env.cfg.RedisURL, env.cfg.RedisPrefix = url, prefix
		opts, err := redis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		rc := redis.NewClient(opts)
		t.Cleanup(func() {
			iter := rc.Scan(ctx, 0, prefix+"*", 100).Iterator()
			for iter.Next(ctx) {
				rc.Del(ctx, iter.Val())
			}
			_ = rc.Close()
		})
	case "mongo": // a database of its own: recoverers claim every lapsed record of their collection
		env.cfg.MongoURI, env.cfg.MongoDB = envOr("IDEM_MONGO_URI", "mongodb://127.0.0.1:27017/"), "steps_"+suffix
		env.args = append(env.args, "-mongo-uri", env.cfg.MongoURI, "-mongo-db", env.cfg.MongoDB)
		client, err := mongo.Connect(options.Client().ApplyURI(env.cfg.MongoURI))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = client.Database(env.cfg.MongoDB).Drop(ctx)
			_ = client.Disconnect(ctx)
		})
	case "postgres":
		url, schema := envOr("IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test"), "steps_"+suffix
		env.args = append(env.args, "-postgres-url", url, "-postgres-schema", schema)
		env.cfg.PostgresURL, env.cfg.PostgresSchema = url, schema
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			pool.Close()
		})
		table := pgx.Identifier{schema, "payments"}.Sanitize()
		env.rows = func(t *testing.T, user string) (n int64) {
			t.Helper()
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE user_id = $1", user).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
	case "mysql":
		cfg, err := mysql.ParseDSN(envOr("IDEM_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.DBName = "steps_" + suffix
		env.args = append(env.args, "-mysql-dsn", cfg.FormatDSN())
		env.cfg.MySQLDSN = cfg.FormatDSN()
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+cfg.DBName)
			db.Close()
		})
		env.rows = func(t *testing.T, user string) (n int64) {
			t.Helper()
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM payments WHERE user_id = ?", user).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return env
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// start runs an instance of the service on env's store and provider.
func (env *crashEnv) start(t *testing.T, args ...string) *procs.Proc {
	t.Helper()
	p, err := procs.Start(env.bin, env.logs, append(append([]string{}, env.args...), args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// providerStats is the card provider's GET /v1/stats.
type providerStats struct {
	Charges, Emails int64
	KeyedCalls      int64 `json:"keyed_calls"`
	Conflicts       int64
}

func (env *crashEnv) stats(t *testing.T) providerStats {
	t.Helper()
	resp, err := http.Get(env.provider + "/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st providerStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// crash sends one payment to an instance held at point, SIGKILLs it
// there, restarts the service without the hold and retries the payment
// until a final answer, which must then replay. It returns the answer and
// the provider's new charges and receipts, and the payment's ledger rows.
func (env *crashEnv) crash(t *testing.T, point string, amount int64, noSteps bool) (crashOutcome, int64) {
	t.Helper()
	var extra []string
	if noSteps {
		extra = []string{"-no-steps"}
	}
	before := env.stats(t)
	user, key := "crash-"+rand.Text()[:8], rand.Text()
	a := env.start(t, append([]string{"-pause-at", point}, extra...)...)
	sent := make(chan struct{})
	go func() { defer close(sent); _, _, _ = send(a.URL, user, key, amount) }() // cut by the SIGKILL
	if _, err := a.Line("paused at " + point); err != nil {
		t.Fatalf("%s: %v", point, err)
	}
	a.Kill()
	<-sent
	b := env.start(t, extra...)
	defer b.Stop()
	status, body := retry(t, b.URL, user, key, amount)
	again, h, body2 := send(b.URL, user, key, amount)
	switch {
	case status != http.StatusConflict && (again != status || h.Get(idem.ReplayedHeader) != "true" || string(body2) != string(body)):
		t.Errorf("%s: the retry after 201 got %d %s (replayed %q), want the payment replayed", point, again, body2, h.Get(idem.ReplayedHeader))
	case status == http.StatusConflict && (again != status || !strings.Contains(string(body), "operation-uncertain")):
		t.Errorf("%s: 409 %s then %d %s, want operation-uncertain twice", point, body, again, body2)
	}
	after := env.stats(t)
	var rows int64
	if env.rows != nil {
		rows = env.rows(t, user)
	}
	return crashOutcome{status, after.Charges - before.Charges, after.Emails - before.Emails}, rows
}

// amount is every crash test's payment.
const amount = 1200

// send POSTs one payment of user with key to base; status 0 when no
// answer came.
func send(base, user, key string, amount int64) (int, http.Header, []byte) {
	body := fmt.Sprintf(`{"amount":%d,"currency":"eur"}`, amount)
	req, err := http.NewRequest("POST", base+"/v1/payments", strings.NewReader(body))
	if err != nil {
		return 0, nil, nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", user)
	req.Header.Set("Idempotency-Key", key)
	client := &http.Client{Timeout: 90 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// retry sends the payment until a final answer (60s at most): it waits
// out a 409 with Retry-After (the key in progress: its crashed or stalled
// holder's lease has not lapsed yet) and retries 5xx and connection
// failures; anything else is final (a 409 without Retry-After is
// operation-uncertain).
func retry(t *testing.T, base, user, key string, amount int64) (int, []byte) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		status, h, body := send(base, user, key, amount)
		wait := 100 * time.Millisecond
		switch {
		case status == http.StatusConflict && h.Get("Retry-After") != "":
			if s, err := strconv.Atoi(h.Get("Retry-After")); err == nil {
				wait = min(time.Duration(s)*time.Second, 2*time.Second)
			}
		case status != 0 && status < 500:
			return status, body
		}
		if time.Now().After(deadline) {
			t.Fatalf("no final answer in 60s; last %d %s", status, body)
		}
		time.Sleep(wait)
	}
}
