package benchmarks

import (
	"net/http"
	"sync"
	"testing"
	"time"
)

// paired runs b.N ops of a and b.N ops of b in alternating chunks, so that
// both sides see the same machine load even when it drifts (the machine is
// shared), and reports each side's ns per op and the ratio a ÷ b. parallel
// > 0 spreads every chunk over that many goroutines. ns/op of the
// benchmark itself covers both sides.
func paired(bm *testing.B, nameA, nameB string, parallel int, a, b func() error) {
	const chunk = 500
	var ta, tb time.Duration
	run := func(fn func() error, n int) time.Duration {
		start := time.Now()
		if parallel <= 0 {
			for range n {
				if err := fn(); err != nil {
					bm.Fatal(err)
				}
			}
			return time.Since(start)
		}
		var wg sync.WaitGroup
		per := (n + parallel - 1) / parallel
		for g := 0; g < parallel; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
					if err := fn(); err != nil {
						bm.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	bm.ResetTimer()
	for done := 0; done < bm.N; done += chunk {
		n := min(chunk, bm.N-done)
		if (done/chunk)%2 == 0 {
			ta += run(a, n)
			tb += run(b, n)
		} else {
			tb += run(b, n)
			ta += run(a, n)
		}
	}
	bm.StopTimer()
	bm.ReportMetric(float64(ta)/float64(bm.N), nameA+"-ns/op")
	bm.ReportMetric(float64(tb)/float64(bm.N), nameB+"-ns/op")
	bm.ReportMetric(float64(ta)/float64(tb), nameA+"/"+nameB)
}

// BenchmarkFiberPeer is the same comparison as BenchmarkFiberBuiltin versus
// BenchmarkMiddleware/fw=fiber, with idem and the built-in middleware
// alternating in chunks of 500 requests within one benchmark: the ratio
// idem/builtin is immune to load drift between benchmarks.
func BenchmarkFiberPeer(b *testing.B) { benchPeer(b, "fiber", newFiberBuiltin) }

// benchPeer runs idem on framework fwName and that framework's own
// idempotency middleware (builtin) paired, on the fresh and replay paths.
func benchPeer(b *testing.B, fwName string, builtin func() driver) {
	var idemFW framework
	for _, fw := range frameworks {
		if fw.name == fwName {
			idemFW = fw
		}
	}
	for _, path := range []string{"fresh", "replay"} {
		b.Run("path="+path, func(b *testing.B) {
			e, _ := newMemEngine(b)
			ours, theirs := idemFW.build(e), builtin()
			key := newKey()
			for _, d := range []driver{ours, theirs} {
				if code := d.do(http.MethodPost, key); code != http.StatusCreated {
					b.Fatalf("first: %s", statusText(code))
				}
			}
			op := func(d driver) func() error {
				return func() error {
					k := key
					if path == "fresh" {
						k = newKey()
					}
					if code := d.do(http.MethodPost, k); code != http.StatusCreated {
						b.Fatalf("%s: %s", path, statusText(code))
					}
					return nil
				}
			}
			paired(b, "idem", "builtin", 0, op(ours), op(theirs))
		})
	}
}
