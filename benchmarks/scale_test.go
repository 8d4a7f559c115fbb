package benchmarks

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/memstore"
)

// scaleBody is the 200-byte response body of the scale benchmarks.
var scaleBody = []byte(fmt.Sprintf(`{"id":"pay_1","amount":4200,"currency":"EUR","status":"succeeded","note":"%0125d"}`, 0))

// scaleResponse returns the engine's encoding of a 201 with Content-Type,
// Location and scaleBody.
func scaleResponse() []byte {
	return engineEncoding(http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_1"}}, scaleBody)
}

// fakeClock is a memstore clock that moves only when told.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := new(fakeClock)
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// heapAlloc returns the live heap after a full collection.
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// preloaded is a memstore holding n completed records (200-byte body,
// retention 24h) and the bytes each record took on the heap.
type preloaded struct {
	s         *memstore.Store
	clk       *fakeClock
	perRecord float64
}

var preloadCache = map[int]*preloaded{}

func preload(b *testing.B, n int) *preloaded {
	if p := preloadCache[n]; p != nil {
		return p
	}
	clear(preloadCache) // keep one preloaded store alive at a time
	clk := newFakeClock()
	before := heapAlloc()
	s := memstore.New(memstore.WithClock(clk.now), memstore.WithMaxRecords(1<<40), memstore.WithCleanupInterval(0))
	ctx := context.Background()
	resp := scaleResponse()
	for range n {
		key, tok := storetest.Key(), storetest.Token()
		if _, ok, err := s.Acquire(ctx, key, tok, storetest.Key(), time.Minute); err != nil || !ok {
			b.Fatalf("preload Acquire = %v, %v", ok, err)
		}
		if err := s.Complete(ctx, key, tok, resp, 24*time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	p := &preloaded{s: s, clk: clk, perRecord: float64(heapAlloc()-before) / float64(n)}
	preloadCache[n] = p
	return p
}

// BenchmarkMemScale measures acquire+complete on a memstore already holding
// 10^3, 10^5 or 10^6 live records (10^6 only with -bench.full). Fresh keys
// would grow the store with b.N, so the measured keys rotate through 1,024
// slots whose records expired (1 µs retention on a fake clock advanced 1 µs
// per op): the store keeps n+1,024 records and every acquire is of a key
// with no live record. It also reports bytes per stored record (200-byte
// body), from runtime.MemStats around the preload.
func BenchmarkMemScale(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		b.Run("records="+strconv.Itoa(n), func(b *testing.B) {
			if n > 100_000 && !*full {
				b.Skip("10^6 records only with -bench.full")
			}
			p := preload(b, n)
			keys := make([]string, 1024)
			for i := range keys {
				keys[i] = storetest.Key()
			}
			ctx := context.Background()
			resp := scaleResponse()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				key := keys[i&1023]
				p.clk.advance(time.Microsecond)
				if _, ok, err := p.s.Acquire(ctx, key, "tok", "fp", time.Microsecond); err != nil || !ok {
					b.Fatalf("Acquire = %v, %v", ok, err)
				}
				if err := p.s.Complete(ctx, key, "tok", resp, time.Microsecond); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(p.perRecord, "B/record")
		})
	}
}

// BenchmarkMemRetention fills a memstore with 10^5 records (10^6 with
// -bench.full), lets retention pass on a fake clock and runs Cleanup: the
// heap must return to its baseline. One op is the whole cycle; it reports
// the live heap before, loaded and after, and after/before.
func BenchmarkMemRetention(b *testing.B) {
	n := 100_000
	if *full {
		n = 1_000_000
	}
	clear(preloadCache)
	ctx := context.Background()
	resp := scaleResponse()
	var base, loaded, after uint64
	for b.Loop() {
		clk := newFakeClock()
		base = heapAlloc()
		s := memstore.New(memstore.WithClock(clk.now), memstore.WithMaxRecords(1<<40), memstore.WithCleanupInterval(0))
		for range n {
			key, tok := storetest.Key(), storetest.Token()
			if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
				b.Fatalf("Acquire = %v, %v", ok, err)
			}
			if err := s.Complete(ctx, key, tok, resp, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
		loaded = heapAlloc()
		clk.advance(2 * time.Hour)
		if got := s.Cleanup(); got != n {
			b.Fatalf("Cleanup deleted %d of %d", got, n)
		}
		after = heapAlloc()
		runtime.KeepAlive(s)
		s.Close()
	}
	b.ReportMetric(float64(n), "records")
	b.ReportMetric(float64(base), "heap-base-B")
	b.ReportMetric(float64(loaded), "heap-loaded-B")
	b.ReportMetric(float64(after), "heap-after-B")
	b.ReportMetric(float64(after)/float64(base), "after/base")
}

// BenchmarkRedisRecordSize completes 1,000 records with a 200-byte body
// through redisstore and reports the mean MEMORY USAGE of one record (key,
// string value and its overhead, SAMPLES 0) and the growth of INFO
// used_memory per record. One op is the whole measurement.
func BenchmarkRedisRecordSize(b *testing.B) {
	const n = 1000
	c, prefix, _ := newRedisClient(b)
	s := redisstoreNew(c, prefix)
	ctx := context.Background()
	resp := scaleResponse()
	var usage, grown float64
	for b.Loop() {
		before := usedMemory(b, c)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = storetest.Key()
			tok := storetest.Token()
			if _, ok, err := s.Acquire(ctx, keys[i], tok, storetest.Key(), time.Minute); err != nil || !ok {
				b.Fatalf("Acquire = %v, %v", ok, err)
			}
			if err := s.Complete(ctx, keys[i], tok, resp, benchRetention); err != nil {
				b.Fatal(err)
			}
		}
		grown = float64(usedMemory(b, c)-before) / n
		var total int64
		for _, k := range keys {
			u, err := c.MemoryUsage(ctx, prefix+k, 0).Result()
			if err != nil {
				b.Fatal(err)
			}
			total += u
		}
		usage = float64(total) / n
		for _, k := range keys {
			c.Unlink(ctx, prefix+k)
		}
	}
	b.ReportMetric(usage, "B/record")
	b.ReportMetric(grown, "used_memory-B/record")
}
