package procs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/procs"
)

// TestTelemetry plays fresh, 409, replay, 422, 400 and 503 against every
// example service (its Redis store a private redis-server, stopped for the
// 503) and checks that /metrics counts exactly one of each outcome plus the
// completion, and, on the net/http based services (traced with otelhttp),
// that the span of the replayed request, found by the trace id the client
// sent in its traceparent header, carries idem.outcome = replayed and the
// scoped key.
func TestTelemetry(t *testing.T) {
	redisServer, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not found (CI=true: failing instead of skipping)")
		}
		t.Skip("redis-server not found; skipping (set CI=true to fail instead)")
	}
	bin, err := procs.Build(context.Background(), t.TempDir(), "payments")
	if err != nil {
		t.Fatal(err)
	}
	// All at once, not t.Parallel (which runs GOMAXPROCS at a time): each
	// mostly waits for its charge.
	var wg sync.WaitGroup
	for _, name := range procs.Frameworks {
		wg.Go(func() {
			t.Run(name, func(t *testing.T) {
				testTelemetry(t, name, bin, redisServer)
			})
		})
	}
	wg.Wait()
}

func testTelemetry(t *testing.T, name, bin, redisServer string) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "redis.sock")
	redis := exec.Command(redisServer, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no")
	if err := redis.Start(); err != nil {
		t.Fatal(err)
	}
	redisDone := make(chan struct{})
	go func() { _ = redis.Wait(); close(redisDone) }()
	stopRedis := func() {
		_ = redis.Process.Kill()
		<-redisDone
	}
	t.Cleanup(stopRedis)
	waitFor(t, "redis-server's socket", func() bool { _, err := os.Stat(sock); return err == nil })

	traces := filepath.Join(dir, "spans.json")
	logs, err := os.Create(filepath.Join(dir, "service.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	// The charge lasts long enough for the duplicate to find it in progress
	// (10s: six services run at once, on a loaded machine): the test waits
	// for idem.execution.active = 1 on /metrics, not for time.
	p, err := procs.Start(bin, logs, "-framework", name, "-store", "redis", "-redis-url", "unix://"+sock, "-charge-latency", "10s", "-trace-file", traces)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			p.Stop()
		}
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("service log:\n%s", b)
		}
	}()

	client := &http.Client{Timeout: 30 * time.Second}
	pay := func(key, body, traceparent string) (int, http.Header) {
		req, err := http.NewRequest("POST", p.URL+"/v1/payments", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User-ID", "u1")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		if traceparent != "" {
			req.Header.Set("Traceparent", traceparent)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("POST: %v", err)
			return 0, nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	const body = `{"amount":1000,"currency":"eur"}`

	fresh := make(chan int, 1)
	go func() { code, _ := pay("k1", body, ""); fresh <- code }()
	waitFor(t, "the fresh request in progress", func() bool { return scrape(t, client, p.URL).Sum("idem_execution_active") == 1 })
	if code, _ := pay("k1", body, ""); code != http.StatusConflict {
		t.Errorf("duplicate in progress: %d, want 409", code)
	}
	if code := <-fresh; code != http.StatusCreated {
		t.Fatalf("fresh: %d, want 201", code)
	}
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	if code, h := pay("k1", body, "00-"+traceID+"-00f067aa0ba902b7-01"); code != http.StatusCreated || h.Get(idem.ReplayedHeader) != "true" {
		t.Errorf("retry: %d %v, want a 201 replay", code, h)
	}
	if code, _ := pay("k1", `{"amount":2000,"currency":"eur"}`, ""); code != http.StatusUnprocessableEntity {
		t.Errorf("other payload: %d, want 422", code)
	}
	if code, _ := pay("", body, ""); code != http.StatusBadRequest {
		t.Errorf("no key: %d, want 400", code)
	}
	stopRedis()
	if code, _ := pay("k2", body, ""); code != http.StatusServiceUnavailable {
		t.Errorf("store down: %d, want 503", code)
	}

	want := map[string]float64{"acquired": 1, "completed": 1, "conflict": 1, "replayed": 1, "mismatch": 1, "rejected": 1, "store-error": 1}
	got := scrape(t, client, p.URL).Decisions()
	for outcome, n := range want {
		if got[outcome] != n {
			t.Errorf("idem_decisions_total{idem_outcome=%q} = %v, want %v", outcome, got[outcome], n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("outcomes on /metrics: %v, want exactly %v", got, want)
	}
	if n := scrape(t, client, p.URL).Sum("idem_handler_duration_seconds_count"); n != 1 {
		t.Errorf("idem_handler_duration_seconds_count = %v, want 1", n)
	}
	if n := scrape(t, client, p.URL).Sum("idem_execution_active"); n != 0 {
		t.Errorf("idem_execution_active = %v after the last execution ended, want 0", n)
	}
	p.Stop() // flushes the spans
	stopped = true

	if strings.HasPrefix(name, "fiber") {
		return // Fiber is not net/http: the example has no tracing middleware
	}
	f, err := os.Open(traces)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	found := false
	for sc.Scan() {
		var span struct {
			SpanContext struct{ TraceID string }
			Attributes  []struct {
				Key   string
				Value struct{ Value any }
			}
		}
		if err := json.Unmarshal(sc.Bytes(), &span); err != nil {
			t.Fatalf("span %q: %v", sc.Text(), err)
		}
		if span.SpanContext.TraceID != traceID {
			continue
		}
		found = true
		attrs := map[string]any{}
		for _, a := range span.Attributes {
			attrs[a.Key] = a.Value.Value
		}
		if attrs["idem.outcome"] != "replayed" || attrs["idem.scoped_key"] != idem.ScopedKey("u1", "POST", "/v1/payments", "k1") {
			t.Errorf("span of the replayed request: idem.outcome %v, idem.scoped_key %v; want replayed and the scoped key", attrs["idem.outcome"], attrs["idem.scoped_key"])
		}
	}
	if !found {
		t.Errorf("no span with the trace id %s the replayed request carried", traceID)
	}
}

// waitFor polls cond every 10ms for up to 30s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// scrape returns the samples of /metrics.
func scrape(t *testing.T, client *http.Client, base string) procs.Metrics {
	t.Helper()
	m, err := procs.Scrape(client, base)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
