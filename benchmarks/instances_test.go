package benchmarks

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/adapters/idemhttp"
	"github.com/idemkit/idem/benchmarks/internal/harness"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/redisstore"
)

// BenchmarkInstances measures throughput as instances are added: n
// in-process services (net/http with idemhttp, each with its own engine
// and go-redis client) listen on loopback and share one Redis
// (IDEM_REDIS_URL, one key prefix). Clients go round-robin over their
// addresses; one op is a logical request: a fresh key POSTed to one
// instance, then its retry POSTed to the next, which must replay it.
// 16 client goroutines whatever n. Reported: logical/s and HTTP req/s in
// all, HTTP req/s per instance, executions per logical request (exactly 1,
// else the benchmark fails).
//
// Every instance, the clients and (when local) Redis share the machine's
// cores: on 2 cores the total is bounded by the CPU, so what adding
// instances can show is the cost of coordinating them through Redis, not
// capacity gained.
func BenchmarkInstances(b *testing.B) {
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("instances=%d", n), func(b *testing.B) {
			c, prefix, _ := newRedisClient(b)
			urls := make([]string, n)
			for i := range urls {
				// Each instance its own client, as separate processes would.
				ci := c
				if i > 0 {
					ci, _, _ = newRedisClient(b)
				}
				e, err := idem.New(redisstore.New(ci, redisstore.WithPrefix(prefix)))
				if err != nil {
					b.Fatal(err)
				}
				mux := http.NewServeMux()
				mux.Handle("POST "+route, idemhttp.New(e, idemhttp.WithScope(func(*http.Request) string { return principal }))(http.HandlerFunc(harness.HandleHTTP)))
				srv := httptest.NewServer(mux)
				b.Cleanup(srv.Close)
				urls[i] = srv.URL + route
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			b.Cleanup(client.CloseIdleConnections)
			post := func(url, key string) (int, bool, error) {
				req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(reqBody))
				if err != nil {
					return 0, false, err
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
				resp, err := client.Do(req)
				if err != nil {
					return 0, false, err
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode, resp.Header.Get(idem.ReplayedHeader) == "true", nil
			}
			var next atomic.Uint64
			start := executions.Load()
			b.SetParallelism(8) // 8 × GOMAXPROCS goroutines: 16 on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := next.Add(1)
					key := newKey()
					if st, _, err := post(urls[i%uint64(n)], key); err != nil || st != http.StatusCreated {
						b.Errorf("first: %d %v", st, err)
						return
					}
					if st, replayed, err := post(urls[(i+1)%uint64(n)], key); err != nil || st != http.StatusCreated || !replayed {
						b.Errorf("retry: %d replayed=%v %v", st, replayed, err)
						return
					}
				}
			})
			b.StopTimer()
			secs := b.Elapsed().Seconds()
			if ex := executions.Load() - start; ex != int64(b.N) {
				b.Fatalf("%d executions for %d logical requests", ex, b.N)
			}
			b.ReportMetric(float64(b.N)/secs, "logical/s")
			b.ReportMetric(float64(2*b.N)/secs, "req/s")
			b.ReportMetric(float64(2*b.N)/secs/float64(n), "req/s/instance")
			b.ReportMetric(1, "executions/logical")
		})
	}
}
