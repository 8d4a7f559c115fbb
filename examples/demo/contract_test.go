package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/examples/internal/procs"
)

// TestExamples builds every example service, runs it as its own process with
// the memory store, plays the demo's scenarios and checks the HTTP contract.
func TestExamples(t *testing.T) {
	dir := t.TempDir()
	for _, name := range procs.Frameworks {
		t.Run(name, func(t *testing.T) {
			bin, err := procs.Build(context.Background(), dir, name)
			if err != nil {
				t.Fatal(err)
			}
			p := start(t, bin, "-store", "memory", "-charge-latency", "150ms")
			d := &demo{url: p.URL, latency: 150 * time.Millisecond, client: &http.Client{Timeout: 10 * time.Second}}
			t.Run("Scenarios", func(t *testing.T) {
				for _, r := range d.run() {
					if !r.ok() {
						t.Errorf("%s: %d charges (want %d), %d payment ids, statuses %v", r.scenario, r.charges, r.want, r.ids, r.statuses)
					}
				}
				if d.err != nil {
					t.Error(d.err)
				}
			})
			t.Run("Contract", func(t *testing.T) { testContract(t, d) })
		})
	}
}

// start runs the example bin with args until the test ends; its logs are
// shown if the test failed.
func start(t *testing.T, bin string, args ...string) *procs.Proc {
	t.Helper()
	logs, err := os.Create(filepath.Join(t.TempDir(), "service.log"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := procs.Start(bin, logs, args...)
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

func send(t *testing.T, d *demo, method, path, user, key, body string) reply {
	t.Helper()
	req, _ := http.NewRequest(method, d.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
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

// TestStoreUnreachableAtStartup starts every example against a Redis and a
// MongoDB that are not there: each still starts, serves its unprotected
// routes, and answers 503 on the protected ones without executing anything.
func TestStoreUnreachableAtStartup(t *testing.T) {
	dir := t.TempDir()
	dead := "127.0.0.1:1" // nothing listens on port 1
	for _, name := range procs.Frameworks {
		bin, err := procs.Build(context.Background(), dir, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, store := range []string{"redis", "mongo"} {
			t.Run(name+"/"+store, func(t *testing.T) {
				p := start(t, bin, "-store", store, "-redis-url", "redis://"+dead+"/0", "-mongo-uri", "mongodb://"+dead+"/")
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
		}
	}
}
