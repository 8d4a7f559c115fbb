package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/examples/internal/procs"
)

// TestExamples runs the payments service on every framework as its own process with
// the memory store (and a second one with -no-idem, for the sign-up without
// idem), plays the demo's scenarios and checks the HTTP contract.
func TestExamples(t *testing.T) {
	for _, name := range procs.Frameworks {
		t.Run(name, func(t *testing.T) {
			p := start(t, name, "-store", "memory", "-charge-latency", "150ms")
			plain := start(t, name, "-store", "memory", "-charge-latency", "150ms", "-no-idem")
			d := &demo{url: p.URL, plainURL: plain.URL, latency: 150 * time.Millisecond, client: &http.Client{Timeout: 10 * time.Second}}
			t.Run("Scenarios", func(t *testing.T) {
				for _, r := range d.run() {
					if !r.ok() {
						t.Errorf("%s: executed %d (want %d), %d ids, statuses %v (want %v)", r.scenario, r.executed, r.want, r.ids, r.statuses, r.check)
					}
				}
				if d.err != nil {
					t.Error(d.err)
				}
			})
			t.Run("Contract", func(t *testing.T) { testContract(t, d) })
			t.Run("RequestIDNotReplayed", func(t *testing.T) { testRequestID(t, d) })
		})
	}
}

// binDir holds the payments binary this test binary builds (TestMain
// makes and removes it).
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-demo-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// payments is the payments service's binary, built once for every test
// that runs it (go build links anew each time it is called).
var payments struct {
	once sync.Once
	path string
	err  error
}

// paymentsBin returns the binary of examples/payments, building it the
// first time.
func paymentsBin(t *testing.T) string {
	t.Helper()
	payments.once.Do(func() { payments.path, payments.err = procs.Build(context.Background(), binDir, "payments") })
	if payments.err != nil {
		t.Fatal(payments.err)
	}
	return payments.path
}

// start runs the payments service on framework with args until the test
// ends; its logs are shown if the test failed.
func start(t *testing.T, framework string, args ...string) *procs.Proc {
	t.Helper()
	bin := paymentsBin(t)
	logs, err := os.Create(filepath.Join(t.TempDir(), "service.log"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := procs.Start(bin, logs, append([]string{"-framework", framework}, args...)...)
	if err != nil {
		logs.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		logs.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("service log:\n%s", b)
		}
	})
	return p
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func send(t *testing.T, d *demo, method, path, user, key, body string, header ...string) reply {
	t.Helper()
	req, _ := http.NewRequest(method, d.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if user != "" {
		req.Header.Set("X-User-ID", user)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

// testRequestID checks that a replay carries the X-Request-Id the request-id
// middleware outside idem set for this exchange, not the first one's.
func testRequestID(t *testing.T, d *demo) {
	key := newKey()
	first := send(t, d, "POST", "/v1/payments", "u1", key, `{"amount":700,"currency":"eur"}`, "X-Request-Id", "req-1")
	again := send(t, d, "POST", "/v1/payments", "u1", key, `{"amount":700,"currency":"eur"}`, "X-Request-Id", "req-2")
	if first.status != 201 || first.header.Get("X-Request-Id") != "req-1" {
		t.Fatalf("first: %d X-Request-Id %q", first.status, first.header.Values("X-Request-Id"))
	}
	if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("retry: %d replayed=%q; want the stored replay", again.status, again.header.Get("Idempotent-Replayed"))
	}
	if ids := again.header.Values("X-Request-Id"); len(ids) != 1 || ids[0] != "req-2" {
		t.Errorf("replayed X-Request-Id = %q, want exactly [req-2] (this exchange's)", ids)
	}
}

func testContract(t *testing.T, d *demo) {
	problem := func(r reply, status int, what string) {
		t.Helper()
		if r.status != status || !strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
			t.Errorf("%s: %d %q %s; want a %d problem", what, r.status, r.header.Get("Content-Type"), r.body, status)
		}
	}
	problem(send(t, d, "POST", "/v1/payments", "", newKey(), `{"amount":100,"currency":"eur"}`), 401, "no X-User-ID")
	problem(send(t, d, "POST", "/v1/payments", "u1", "", `{"amount":100,"currency":"eur"}`), 400, "no Idempotency-Key")
	problem(send(t, d, "POST", "/v1/payments", "u1", newKey(), `{"amount":0,"currency":"eur"}`), 400, "amount 0")
	problem(send(t, d, "POST", "/v1/payments", "u1", newKey(), `{"amount":100,"currency":"EUR"}`), 400, "currency EUR")
	problem(send(t, d, "POST", "/v1/payments", "u1", newKey(), `{"amount":`), 400, "broken JSON")

	created := send(t, d, "POST", "/v1/payments", "u1", newKey(), `{"amount":1234,"currency":"usd"}`)
	var p struct {
		ID       string `json:"id"`
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
		UserID   string `json:"user_id"`
	}
	if err := json.Unmarshal(created.body, &p); err != nil || created.status != 201 || !strings.HasPrefix(p.ID, "pay_") ||
		p.Amount != 1234 || p.Currency != "usd" || p.UserID != "u1" || created.header.Get("Location") != "/v1/payments/"+p.ID {
		t.Fatalf("create payment: %d %s Location %q", created.status, created.body, created.header.Get("Location"))
	}
	got := send(t, d, "GET", "/v1/payments/"+p.ID, "", "", "")
	if got.status != 200 || !bytes.Contains(got.body, []byte(p.ID)) {
		t.Errorf("GET payment: %d %s", got.status, got.body)
	}
	if r := send(t, d, "GET", "/v1/payments/pay_nope", "", "", ""); r.status != 404 {
		t.Errorf("GET unknown payment: %d", r.status)
	}
	rf := send(t, d, "POST", "/v1/refunds", "u1", newKey(), `{"payment_id":"`+p.ID+`","amount":200}`)
	if rf.status != 201 || !bytes.Contains(rf.body, []byte(`"id":"re_`)) {
		t.Errorf("refund: %d %s", rf.status, rf.body)
	}
	// Another user, after any request of theirs, can't refund u1's payment
	// (a framework reusing request buffers must not leak one caller's
	// principal into another's request).
	send(t, d, "POST", "/v1/payments", "u9", newKey(), `{"amount":1,"currency":"eur"}`)
	if r := send(t, d, "POST", "/v1/refunds", "u9", newKey(), `{"payment_id":"`+p.ID+`","amount":1}`); r.status != 404 {
		t.Errorf("another user refunded u1's payment: %d %s", r.status, r.body)
	}
	if r := send(t, d, "POST", "/v1/refunds", "u1", newKey(), `{"payment_id":"pay_nope","amount":1}`); r.status != 404 {
		t.Errorf("refund of an unknown payment: %d", r.status)
	}

	key := newKey()
	ex := send(t, d, "POST", "/v1/exports", "u1", key, `{"bytes":5000}`)
	if ex.status != 200 || ex.header.Get("Content-Type") != "application/octet-stream" || len(ex.body) != 16+5000 {
		t.Fatalf("export: %d %q %d bytes", ex.status, ex.header.Get("Content-Type"), len(ex.body))
	}
	for i := 0; i < 5000; i++ {
		if ex.body[16+i] != byte(i) {
			t.Fatalf("export byte %d = %d", i, ex.body[16+i])
		}
	}
	again := send(t, d, "POST", "/v1/exports", "u1", key, `{"bytes":5000}`)
	if !bytes.Equal(again.body, ex.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("export replay differs (random prefix %x vs %x)", again.body[:16], ex.body[:16])
	}
	before := d.executions()
	send(t, d, "POST", "/v1/exports", "u1", newKey(), `{"bytes":1}`)
	if after := d.executions(); after != before+1 {
		t.Errorf("stats: executions went %d -> %d for one export", before, after)
	}
}

// TestStoreUnreachableAtStartup starts the service on every framework against a Redis, a
// MongoDB and a MySQL that are not there: each still starts, serves its unprotected
// routes, and answers 503 on the protected ones without executing anything.
// The cases run all at once (each mostly waits for its store's dial to
// fail), not t.Parallel (GOMAXPROCS at a time).
func TestStoreUnreachableAtStartup(t *testing.T) {
	dead := "127.0.0.1:1" // nothing listens on port 1
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, name := range procs.Frameworks {
		for _, store := range []string{"redis", "mongo", "mysql"} {
			wg.Go(func() {
				t.Run(name+"/"+store, func(t *testing.T) {
					p := start(t, name, "-store", store, "-redis-url", "redis://"+dead+"/0", "-mongo-uri", "mongodb://"+dead+"/",
						"-mysql-dsn", "root@tcp("+dead+")/test")
					d := &demo{url: p.URL, client: &http.Client{Timeout: 10 * time.Second}}
					if n := d.executions(); n != 0 {
						t.Fatalf("stats: %d executions", n)
					}
					r := send(t, d, "POST", "/v1/payments", "u1", newKey(), `{"amount":100,"currency":"eur"}`)
					if r.status != 503 || r.header.Get("Retry-After") == "" || !bytes.Contains(r.body, []byte("store-unavailable")) {
						t.Fatalf("payment with the store down: %d %s", r.status, r.body)
					}
					if n := d.executions(); n != 0 {
						t.Fatalf("the handler ran %d times with the store down", n)
					}
				})
			})
		}
	}
}

// TestRequestIDEveryStore runs testRequestID through every framework with the
// Redis, MongoDB and MySQL stores (TestExamples covers the memory store): the
// header selection must hold whatever store keeps the response.
func TestRequestIDEveryStore(t *testing.T) {
	rc := redisClient(t)
	prefix := "idem-demo-test:" + rand.Text()[:12] + ":"
	t.Cleanup(func() { deleteKeys(rc, prefix) })
	mongoURI := os.Getenv("IDEM_MONGO_URI")
	if mongoURI == "" {
		mongoURI = "mongodb://127.0.0.1:27017/"
	}
	mongoUp := mongoReachable(mongoURI)
	if !mongoUp && os.Getenv("CI") == "true" {
		t.Fatalf("MongoDB unreachable at %s (IDEM_MONGO_URI)", mongoURI)
	}
	mysqlDSN := mysqlDatabase(t)
	for _, name := range procs.Frameworks {
		t.Run(name+"/mysql", func(t *testing.T) {
			p := start(t, name, "-store", "mysql", "-mysql-dsn", mysqlDSN, "-charge-latency", "1ms")
			testRequestID(t, &demo{url: p.URL, client: &http.Client{Timeout: 10 * time.Second}})
		})
		t.Run(name+"/redis", func(t *testing.T) {
			p := start(t, name, "-store", "redis", "-redis-url", redisURL(), "-redis-prefix", prefix, "-charge-latency", "1ms")
			testRequestID(t, &demo{url: p.URL, client: &http.Client{Timeout: 10 * time.Second}})
		})
		t.Run(name+"/mongo", func(t *testing.T) {
			if !mongoUp {
				t.Skipf("MongoDB unreachable at %s (IDEM_MONGO_URI); set CI=true to fail instead", mongoURI)
			}
			p := start(t, name, "-store", "mongo", "-mongo-uri", mongoURI, "-charge-latency", "1ms")
			testRequestID(t, &demo{url: p.URL, client: &http.Client{Timeout: 10 * time.Second}})
		})
	}
}
