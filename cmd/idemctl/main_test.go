package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mongostore"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// The tests talk to the Redis at IDEM_REDIS_URL (default
// redis://127.0.0.1:6379/0), the MongoDB-wire server at IDEM_MONGO_URI
// (FerretDB under `make test`), the PostgreSQL at IDEM_POSTGRES_URL
// (default postgres://postgres@127.0.0.1:5432/test) and the MySQL/MariaDB
// at IDEM_MYSQL_DSN (default root@tcp(127.0.0.1:3306)/test). A missing
// server fails the test.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testStore is one store under test: the URL and flags idemctl is given,
// the same store for the engine, and whether it keeps in-progress records
// whose lease lapsed until they are purged (SQL, MongoDB; Redis expires
// them with the lease), and whether its pages are SCAN batches.
type testStore struct {
	store      idem.Store
	args       []string
	keepsLapse bool
	scans      bool // pages are whole SCAN batches (Redis), not exactly -limit records
	// wrongLayout are flags naming a layout the service does not use (a
	// table, collection or prefix that holds nothing).
	wrongLayout []string
}

func redisBackend(t *testing.T) testStore {
	u := os.Getenv("IDEM_REDIS_URL")
	if u == "" {
		u = "redis://127.0.0.1:6379/0"
	}
	opts, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Redis at %s (IDEM_REDIS_URL): %v", u, err)
	}
	prefix := "idemctl-test:" + rand.Text() + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
	})
	return testStore{store: redisstore.New(client, redisstore.WithPrefix(prefix)), args: []string{"-store", u, "-prefix", prefix}, scans: true,
		wrongLayout: []string{"-prefix", "idemctl-test-none:" + rand.Text() + ":"}}
}

func mongoBackend(t *testing.T) testStore {
	u := os.Getenv("IDEM_MONGO_URI")
	if u == "" {
		t.Fatal("IDEM_MONGO_URI is not set (source scripts/services.sh)")
	}
	client, err := mongo.Connect(options.Client().ApplyURI(u))
	if err != nil {
		t.Fatal(err)
	}
	coll := client.Database("idemctl_test").Collection("c" + strings.ToLower(rand.Text()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = coll.Drop(ctx)
		_ = client.Disconnect(ctx)
	})
	s := mongostore.New(coll)
	t.Cleanup(func() { _ = s.Close() })
	return testStore{store: s, args: []string{"-store", u, "-collection", "idemctl_test." + coll.Name()}, keepsLapse: true,
		wrongLayout: []string{"-collection", "idemctl_test.none" + strings.ToLower(rand.Text())}}
}

func postgresBackend(t *testing.T) testStore {
	u := os.Getenv("IDEM_POSTGRES_URL")
	if u == "" {
		u = "postgres://postgres@127.0.0.1:5432/test"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	table := "idemctl_t_" + strings.ToLower(rand.Text()[:12])
	s := pgstore.New(pool, pgstore.WithTable(table))
	t.Cleanup(func() {
		_ = s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+table)
		pool.Close()
	})
	if err := s.EnsureSchema(ctx); err != nil {
		t.Fatalf("PostgreSQL at %s (IDEM_POSTGRES_URL): %v", u, err)
	}
	return testStore{store: s, args: []string{"-store", u, "-table", table}, keepsLapse: true,
		wrongLayout: []string{"-table", "idemctl_none_" + strings.ToLower(rand.Text()[:12])}}
}

func mysqlBackend(t *testing.T) testStore {
	dsn := os.Getenv("IDEM_MYSQL_DSN")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	table := "idemctl_t_" + strings.ToLower(rand.Text()[:12])
	s := mysqlstore.New(db, mysqlstore.WithTable(table))
	t.Cleanup(func() {
		_ = s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+table+"`")
		_, _ = db.ExecContext(ctx, "DROP PROCEDURE IF EXISTS `"+table+mysqlstore.ProcSuffix+"`")
		_ = db.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.EnsureSchema(ctx); err != nil {
		t.Fatalf("MySQL at %s (IDEM_MYSQL_DSN): %v", cfg.Addr, err)
	}
	// The service's own address form: go-sql-driver's DSN.
	return testStore{store: s, args: []string{"-store", dsn, "-table", table}, keepsLapse: true,
		wrongLayout: []string{"-table", "idemctl_none_" + strings.ToLower(rand.Text()[:12])}}
}

var backends = map[string]func(*testing.T) testStore{
	"redis": redisBackend, "mongo": mongoBackend, "postgres": postgresBackend, "mysql": mysqlBackend,
}

// TestStuckRecord is the operator's story on Redis, FerretDB and MariaDB: a
// process crashed holding a lease, so retries get 409; idemctl shows the
// record and its owner, a "no" keeps it, -yes evicts it, and the retry
// executes; the completed record shows its status, headers and body size.
func TestStuckRecord(t *testing.T) {
	for name, newBackend := range backends {
		t.Run(name, func(t *testing.T) { testStuckRecord(t, newBackend(t)) })
	}
}

func testStuckRecord(t *testing.T, b testStore) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engine, err := idem.New(b.store)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = engine.Close(ctx) }()
	body := []byte(`{"amount":1000}`)
	request := func() *idem.Request {
		return &idem.Request{Method: "POST", Route: "/v1/payments", Path: "/v1/payments", ContentType: "application/json",
			Keys: []string{`"pay-7f3a"`}, Principal: "acct_1", Body: body}
	}
	scoped := idem.ScopedKey("acct_1", "POST", "/v1/payments", "pay-7f3a")
	// The crashed process: it took the lease for an hour and never came back.
	fp := idem.Fingerprint("POST", "/v1/payments", "", "application/json", body)
	// Its lease (the service's -lease 3m) has a minute left: below the
	// 116s (3m - 1m - 2 × 2s) a holder that renews keeps.
	if _, ok, err := b.store.Acquire(ctx, scoped, "web-3:4242:K7QXR2MZLJ2XW5RV.17", fp, time.Minute); err != nil || !ok {
		t.Fatalf("Acquire for the crashed process = %v, %v", ok, err)
	}
	if x, resp := engine.Begin(ctx, request()); x != nil || resp == nil || resp.Status != http.StatusConflict {
		t.Fatalf("retry while the lease is held: want 409")
	}

	idemctl := func(stdin string, args ...string) (int, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		args = append(append(args[:1:1], b.args...), args[1:]...)
		code := run(ctx, args, strings.NewReader(stdin), &out, &errOut)
		if errOut.Len() > 0 {
			t.Logf("idemctl %v stderr: %s", args, errOut.String())
		}
		return code, out.String()
	}
	scope := []string{"-principal", "acct_1", "-route", "/v1/payments", "-key", "pay-7f3a"}
	code, out := idemctl("", append([]string{"show", "-lease", "3m"}, scope...)...)
	for _, want := range []string{"scoped key   " + scoped, "store key    ", "state        in-progress",
		"lease owner  host web-3, pid 4242 (token web-3:4242:K7QXR2MZLJ2XW5RV.17)", "holder       stopped renewing", "fingerprint  " + fp} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("show = %d\n%s\nwant exit 0 and %q", code, out, want)
		}
	}
	if code, out := idemctl("", append([]string{"list", "-lease", "3m", "-state", "in-progress"}, scope...)...); code != exitOK ||
		!strings.Contains(out, scoped+"  in-progress  lease held") || !strings.Contains(out, "NOT renewed") || !strings.Contains(out, "host web-3, pid 4242") {
		t.Fatalf("list of the stopped holder = %d\n%s", code, out)
	}
	if code, byHex := idemctl("", "show", "-lease", "3m", "-scoped-key", strings.ToUpper(scoped)); code != exitOK || withoutTTL(byHex) != withoutTTL(out) {
		t.Fatalf("show -scoped-key = %d\n%s\nwant the same view as by scope", code, byHex)
	}

	if code, out := idemctl("n\n", append([]string{"evict"}, scope...)...); code != exitFail || !strings.Contains(out, "not evicted") {
		t.Fatalf("evict answered no = %d\n%s", code, out)
	}
	if code, out := idemctl("", append([]string{"evict"}, scope...)...); code != exitFail || !strings.Contains(out, "not evicted") {
		t.Fatalf("evict without an answer (stdin closed) = %d\n%s", code, out)
	}
	if x, resp := engine.Begin(ctx, request()); x != nil || resp == nil || resp.Status != http.StatusConflict {
		t.Fatal("the record was evicted without a yes")
	}
	if code, out := idemctl("", append([]string{"evict", "-yes"}, scope...)...); code != exitOK || !strings.Contains(out, "evicted: a request with this key executes again") {
		t.Fatalf("evict -yes = %d\n%s", code, out)
	}

	// The retry executes now; while it runs, show names this host and
	// process, and a lease above the floor (the engine's default 30s lease,
	// just taken).
	x, resp := engine.Begin(ctx, request())
	if x == nil {
		t.Fatalf("retry after eviction was not executed: %+v", resp)
	}
	host, _ := os.Hostname()
	code, out = idemctl("", append([]string{"show"}, scope...)...)
	for _, want := range []string{fmt.Sprintf("lease owner  host %s, pid %d (token ", host, os.Getpid()), "holder       renews it, or took it less than"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("show of a running execution = %d\n%s\nwant %q", code, out, want)
		}
	}
	_, _ = x.Write([]byte(`{"id":"pay_1","status":"succeeded"}`))
	x.Finish(http.StatusCreated, http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_1"}})

	code, out = idemctl("", append([]string{"show"}, scope...)...)
	for _, want := range []string{"state        completed", "(retention)", "status       201", "header       Content-Type: application/json",
		"header       Location: /v1/payments/pay_1", "body         35 bytes"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("show completed = %d\n%s\nwant %q", code, out, want)
		}
	}
	if code, out := idemctl("yes\n", append([]string{"evict"}, scope...)...); code != exitOK || !strings.Contains(out, "Evict this completed record?") {
		t.Fatalf("evict completed, answered yes = %d\n%s", code, out)
	}
	// After an eviction the table, collection or prefix is the service's:
	// no hint says otherwise (the store still holds other records).
	if _, ok, err := b.store.Acquire(ctx, strings.Repeat("f", 64-16)+randomHex(16), "other", fp, time.Hour); err != nil || !ok {
		t.Fatalf("Acquire of another record = %v, %v", ok, err)
	}
	var errOut bytes.Buffer
	showArgs := append(append([]string{"show"}, b.args...), scope...)
	if code := run(ctx, showArgs, strings.NewReader(""), &bytes.Buffer{}, &errOut); code != exitFail || strings.Contains(errOut.String(), "pass ") {
		t.Fatalf("show after eviction = %d, stderr:\n%s\nwant exit 1 and no layout hint", code, errOut.String())
	}
	// A layout the service does not use: the hint names the flag.
	errOut.Reset()
	if code := run(ctx, append(showArgs, b.wrongLayout...), strings.NewReader(""), &bytes.Buffer{}, &errOut); code != exitFail ||
		!strings.Contains(errOut.String(), "pass the same "+b.wrongLayout[0]) && !strings.Contains(errOut.String(), "pass "+b.wrongLayout[0]) {
		t.Fatalf("show %v = %d, stderr:\n%s\nwant the %s hint", b.wrongLayout, code, errOut.String(), b.wrongLayout[0])
	}
}

// TestUsage checks that bad invocations are refused before any I/O.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"list"},
		{"show", "-store", "redis://127.0.0.1:1/0"},                                                                   // no key
		{"show", "-route", "/p", "-key", "k"},                                                                         // no store
		{"show", "-store", "redis://127.0.0.1:1/0", "-route", "/p", "-key", "a,b"},                                    // two keys
		{"show", "-store", "redis://127.0.0.1:1/0", "-scoped-key", "xyz"},                                             // not hex
		{"show", "-store", "memcached://127.0.0.1:1", "-route", "/p", "-key", "k"},                                    // unknown scheme
		{"show", "-store", "mongodb://127.0.0.1:1/", "-collection", "nodot", "-route", "/p", "-key", "k"},             // bad collection
		{"show", "-store", "mysql://root@127.0.0.1:1", "-route", "/p", "-key", "k"},                                   // no database
		{"show", "-store", "redis://127.0.0.1:1/0", "-route", "/p", "-key", "k", "extra"},                             // stray argument
		{"evict", "-store", "redis://127.0.0.1:1/0", "-route", "/p", "-key", "k", "-nonsense"},                        // unknown flag
		{"show", "-store", "redis://127.0.0.1:1/0", "-route", "/p", "-key", strings.Repeat("k", idem.MaxKeyLength+1)}, // too long
		{"show", "-store", "redis://127.0.0.1:1/0", "abc"},                                                            // prefix too short
		{"show", "-store", "redis://127.0.0.1:1/0", strings.Repeat("a", 65)},                                          // too long for a scoped key
		{"show", "-store", "redis://127.0.0.1:1/0", "-scoped-key", "20749a9e2ab7c3dd", "20749a9e2ab7c3dd"},            // key twice
		{"show", "-store", "redis://127.0.0.1:1/0", "20749a9e2ab7c3dd", "-yes", "30749a9e2ab7c3dd"},                   // two keys
		{"show", "-store", "redis://127.0.0.1:1/0", "-route", "/p", "-key", "k", "20749a9e2ab7c3dd"},                  // key and request
		{"list", "-store", "redis://127.0.0.1:1/0", "-state", "stuck"},                                                // unknown state
		{"list", "-store", "redis://127.0.0.1:1/0", "-limit", "0"},                                                    // empty pages
		{"list", "-store", "postgres://127.0.0.1:1/test?sslmode=bogus"},                                               // bad URL
		{"list", "-store", "redis://127.0.0.1:1/0", "key=zz"},                                                         // not hex
		{"list", "-store", "root@tcp(127.0.0.1:1)/"},                                                                  // a MySQL DSN with no database
		{"list", "-store", "127.0.0.1:6379"},                                                                          // an address, no form
		{"show", "-store", "redis://127.0.0.1:1/0", "-lease", "0", "20749a9e2ab7c3dd"},                                // no lease
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, strings.NewReader(""), &out, &errOut); code != exitUsage || errOut.Len() == 0 {
			t.Errorf("idemctl %q = %d, stderr %q; want %d and a message", args, code, errOut.String(), exitUsage)
		}
	}
}

// withoutTTL drops the "expires in" and "holder" lines, which change
// between two calls.
func withoutTTL(out string) string {
	var kept []string
	for l := range strings.Lines(out) {
		if !strings.HasPrefix(l, "expires in") && !strings.HasPrefix(l, "holder") {
			kept = append(kept, l)
		}
	}
	return strings.Join(kept, "")
}

// A completed record whose response does not decode is shown with its
// size and the decoding error, never hidden.
func TestPrintRecordUndecodable(t *testing.T) {
	var b strings.Builder
	printRecord(&b, idem.RecordInfo{Record: idem.Record{State: idem.StateCompleted, Fingerprint: "fp", Response: []byte{9, 9, 9}}}, leaseView{idem.DefaultLease, idem.DefaultStoreTimeout}, time.Now())
	if out := b.String(); !strings.Contains(out, "response     3 bytes that do not decode") || strings.Contains(out, "status") {
		t.Fatalf("printRecord of an undecodable response:\n%s", out)
	}
}

// TestAddressForms: besides the service's own address (the backends
// above: go-sql-driver's DSN, pgx's URL, Redis URL, MongoDB URI), idemctl
// takes a mysql:// URL and pgx's keyword/value DSN for the same store.
func TestAddressForms(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, tc := range map[string]struct {
		backend func(*testing.T) testStore
		form    func(t *testing.T, addr string) string
	}{
		"mysql URL": {mysqlBackend, func(t *testing.T, dsn string) string {
			cfg, err := mysql.ParseDSN(dsn)
			if err != nil {
				t.Fatal(err)
			}
			u := "mysql://" + cfg.User
			if cfg.Passwd != "" {
				u += ":" + cfg.Passwd
			}
			return u + "@" + cfg.Addr + "/" + cfg.DBName
		}},
		"postgres keyword/value": {postgresBackend, func(t *testing.T, u string) string {
			cfg, err := pgxpool.ParseConfig(u)
			if err != nil {
				t.Fatal(err)
			}
			c := cfg.ConnConfig
			dsn := fmt.Sprintf("host=%s port=%d user=%s dbname=%s", c.Host, c.Port, c.User, c.Database)
			if c.Password != "" {
				dsn += " password=" + c.Password
			}
			return dsn
		}},
	} {
		t.Run(name, func(t *testing.T) {
			b := tc.backend(t)
			key := randomHex(64)
			if _, ok, err := b.store.Acquire(ctx, key, "web-1:7:ABC.1", "fp", time.Hour); err != nil || !ok {
				t.Fatalf("Acquire = %v, %v", ok, err)
			}
			args := append([]string{"show"}, b.args...)
			args[2] = tc.form(t, args[2]) // "-store" ADDR
			args = append(args, key)
			var out, errOut bytes.Buffer
			if code := run(ctx, args, strings.NewReader(""), &out, &errOut); code != exitOK || !strings.Contains(out.String(), "lease owner  host web-1, pid 7") {
				t.Fatalf("idemctl %q = %d\n%s%s", args, code, out.String(), errOut.String())
			}
		})
	}
}

// TestHolderClockSkew: a lease just taken, read by a store whose clock runs
// a little ahead (mongostore's estimate of its server's), is a renewing
// holder's, not a -lease too short; a lease longer than -lease by more
// than a store timeout is the latter.
func TestHolderClockSkew(t *testing.T) {
	lv := leaseView{idem.DefaultLease, idem.DefaultStoreTimeout}
	if got := lv.holder(idem.DefaultLease + time.Millisecond); !strings.HasPrefix(got, "renews it, or took it less than 0s ago") {
		t.Errorf("holder(lease + 1ms) = %q, want a renewing holder", got)
	}
	if got := lv.holder(idem.DefaultLease + idem.DefaultStoreTimeout + time.Second); !strings.Contains(got, "is more than -lease") {
		t.Errorf("holder(lease + store timeout + 1s) = %q, want -lease too short", got)
	}
}
