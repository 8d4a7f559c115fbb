package benchmarks

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

var (
	e2eFrameworks = flag.String("bench.e2e", "gin,fiber", "comma-separated -framework values of examples/payments for BenchmarkE2E")
	e2eWorkers    = flag.Int("bench.e2e-workers", 16, "concurrent connections of the BenchmarkE2E load generator")
)

// binDir holds the example binaries built for BenchmarkE2E; TestMain removes it.
var (
	binDir     string
	binDirOnce sync.Once
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildExample compiles the payments service (examples/payments), to be run
// with -framework name, with go build (once per name and run).
var built sync.Map // name -> string (binary path) or error

func buildExample(b *testing.B, name string) string {
	binDirOnce.Do(func() {
		var err error
		if binDir, err = os.MkdirTemp("", "idem-bench-"); err != nil {
			b.Fatal(err)
		}
	})
	if v, ok := built.Load(name); ok {
		if err, isErr := v.(error); isErr {
			b.Fatal(err)
		}
		return v.(string)
	}
	bin := filepath.Join(binDir, name)
	cmd := exec.Command("go", "build", "-o", bin, "github.com/idemkit/idem/examples/payments")
	if out, err := cmd.CombinedOutput(); err != nil {
		err = fmt.Errorf("go build examples/payments for %s: %w\n%s", name, err, out)
		built.Store(name, err)
		b.Fatal(err)
	}
	built.Store(name, bin)
	return bin
}

// service is a running example process.
type service struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startService(b *testing.B, bin string, args ...string) *service {
	cmd := exec.Command(bin, append(args, "-addr", "127.0.0.1:0")...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	s := &service{cmd: cmd, done: make(chan struct{})}
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				select {
				case urls <- u:
				default:
				}
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(s.done) }()
	select {
	case s.url = <-urls:
	case <-s.done:
		b.Fatalf("%s exited before listening", filepath.Base(bin))
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-s.done
		b.Fatalf("%s did not listen within 30s", filepath.Base(bin))
	}
	b.Cleanup(s.stop)
	return s
}

func (s *service) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// BenchmarkE2E loads the payments service (examples/payments) on Gin and Fiber over loopback with
// vegeta (as a library, max rate, -bench.e2e-workers connections): POST
// /v1/payments with -charge-latency 0, with idem on the memory and Redis
// stores and with -no-idem, for fresh traffic (a new key per request,
// custom Targeter) and replay traffic (one key). One op is one request; it
// reports req/s and the p50/p99 latency. Only with -bench.full.
func BenchmarkE2E(b *testing.B) {
	if !*full {
		b.Skip("end-to-end load only with -bench.full")
	}
	redisURL := requireEnv(b, "IDEM_REDIS_URL")
	modes := []struct {
		name string
		args []string
	}{
		{"no-idem", []string{"-no-idem", "-store", "memory"}},
		{"idem-memory", []string{"-store", "memory"}},
		{"idem-redis", []string{"-store", "redis", "-redis-url", redisURL}},
	}
	for _, fw := range strings.Split(*e2eFrameworks, ",") {
		b.Run("fw="+fw, func(b *testing.B) {
			bin := buildExample(b, fw)
			for _, mode := range modes {
				b.Run("mode="+mode.name, func(b *testing.B) {
					svc := startService(b, bin, append([]string{"-framework", fw}, append(mode.args, "-charge-latency", "0", "-ttl", "10m")...)...)
					for _, traffic := range []string{"fresh", "replay"} {
						b.Run("traffic="+traffic, func(b *testing.B) { attack(b, svc.url, traffic == "fresh") })
					}
				})
			}
		})
	}
}

// attack sends b.N requests at max rate and reports the results.
func attack(b *testing.B, url string, fresh bool) {
	var sent atomic.Int64
	replayKey := newKey()
	body := []byte(`{"amount":1000,"currency":"eur"}`)
	targeter := func(t *vegeta.Target) error {
		if sent.Add(1) > int64(b.N) {
			return vegeta.ErrNoTargets
		}
		key := replayKey
		if fresh {
			key = newKey()
		}
		t.Method, t.URL, t.Body = http.MethodPost, url+"/v1/payments", body
		t.Header = http.Header{"Content-Type": {"application/json"}, "X-User-Id": {principal}, "Idempotency-Key": {key}}
		return nil
	}
	if !fresh { // the first execution, so that the attack is all replays
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/payments", bytes.NewReader(body))
		req.Header = http.Header{"Content-Type": {"application/json"}, "X-User-Id": {principal}, "Idempotency-Key": {replayKey}}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			b.Fatalf("first request: %s", resp.Status)
		}
	}
	w := uint64(*e2eWorkers)
	atk := vegeta.NewAttacker(vegeta.Workers(w), vegeta.MaxWorkers(w), vegeta.Connections(int(w)),
		vegeta.KeepAlive(true), vegeta.Timeout(10*time.Second))
	var m vegeta.Metrics
	b.ResetTimer()
	for res := range atk.Attack(targeter, vegeta.Rate{Freq: 0, Per: time.Second}, 0, "e2e") {
		if res.Error == vegeta.ErrNoTargets.Error() {
			continue
		}
		m.Add(res)
	}
	b.StopTimer()
	m.Close()
	if m.Requests != uint64(b.N) {
		b.Fatalf("%d results for %d requests", m.Requests, b.N)
	}
	if len(m.Errors) > 0 || m.StatusCodes["201"] != int(m.Requests) {
		b.Fatalf("status codes %v, errors %v", m.StatusCodes, m.Errors)
	}
	if m.Duration+m.Wait > 0 {
		b.ReportMetric(float64(m.Requests)/(m.Duration+m.Wait).Seconds(), "req/s")
	}
	b.ReportMetric(float64(m.Latencies.P50), "p50-ns")
	b.ReportMetric(float64(m.Latencies.P99), "p99-ns")
}
