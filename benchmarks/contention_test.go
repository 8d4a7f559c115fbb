package benchmarks

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/benchmarks/internal/harness"
	idem "github.com/idemkit/idem/core"
)

// stormSize is the number of concurrent duplicates of one request.
const stormSize = 1000

// BenchmarkContention sends 1,000 concurrent duplicates of one request
// (same key, released together) through the engine. The one that acquires
// holds its execution until every other has been answered, then finishes;
// all others must get 409. A duplicate answered 503 (the store did not
// answer within its timeout: a loaded machine) is retried after its
// Retry-After, as a client would, within harness.DupRetryBudget, and
// counted (store-unavailable/op). One op is one storm (goroutine start-up
// included in ns/op); all-answered-ns is the time from their release until
// all 1,000 have an answer. It reports the p50/p99 latency of the 409s
// (each from its last attempt) and the executions per storm (must be 1).
func BenchmarkContention(b *testing.B) {
	for _, sc := range storeCases[:2] { // memory and redis
		b.Run("store="+sc.name, func(b *testing.B) {
			s, _ := sc.open(b)
			e := newEngine(b, s)
			warm(b, s)
			var lat []time.Duration
			var execs, unavailable int64
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				l, x, u, d := storm(b, e)
				lat = append(lat, l...)
				execs += x
				unavailable += u
				total += d
			}
			b.StopTimer()
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)*50/100]), "p50-409-ns")
				b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-409-ns")
			}
			b.ReportMetric(float64(execs)/float64(b.N), "executions/op")
			b.ReportMetric(float64(unavailable)/float64(b.N), "store-unavailable/op")
			b.ReportMetric(float64(total)/float64(b.N), "all-answered-ns")
		})
	}
}

// storm runs one storm and returns the 409 latencies, the executions, the
// 503 answers retried and the time from the release of all 1,000 until the
// last answer.
func storm(b *testing.B, e *idem.Engine) ([]time.Duration, int64, int64, time.Duration) {
	key := newKey()
	start := make(chan struct{})
	others := make(chan struct{}) // closed when every non-executing request has its answer
	var answered, executed, unavailable atomic.Int64
	lat := make([]time.Duration, stormSize)
	var wg, ready sync.WaitGroup
	for i := range stormSize {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			ready.Done()
			<-start
			t0 := time.Now()
			x, resp := e.Begin(context.Background(), engineRequest(key))
			for deadline := time.Now().Add(harness.DupRetryBudget); resp != nil && resp.Status == http.StatusServiceUnavailable; {
				d, ok := harness.Answer{Status: resp.Status, RetryAfter: resp.Header.Get("Retry-After")}.RetryDelay()
				if !ok || time.Now().Add(d).After(deadline) {
					break
				}
				unavailable.Add(1)
				time.Sleep(d)
				t0 = time.Now()
				x, resp = e.Begin(context.Background(), engineRequest(key))
			}
			switch {
			case x != nil:
				executed.Add(1)
				select { // hold the key until all duplicates are answered
				case <-others:
				case <-time.After(harness.DupRetryBudget + 30*time.Second):
					b.Errorf("duplicates not answered within %v", harness.DupRetryBudget+30*time.Second)
				}
				_, _ = x.Write(respBody)
				x.Finish(http.StatusCreated, respHeader)
				lat[i] = -1
				return
			case resp == nil:
				b.Errorf("request %d passed through", i)
			case resp.Status != http.StatusConflict:
				b.Errorf("request %d answered %s, want 409", i, statusText(resp.Status))
			}
			lat[i] = time.Since(t0)
			if answered.Add(1) == stormSize-1 {
				close(others)
			}
		}()
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	if n := executed.Load(); n != 1 {
		b.Fatalf("%d executions in a storm of %d duplicates, want 1", n, stormSize)
	}
	return slices.DeleteFunc(lat, func(d time.Duration) bool { return d < 0 }), executed.Load(), unavailable.Load(), elapsed
}
