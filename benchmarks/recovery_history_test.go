package benchmarks

import (
	"context"
	"flag"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storetest"
)

var historySizes = flag.String("history", "1000,100000", "comma-separated numbers of completed records BenchmarkLapsedBehindHistory writes before its crashed record (with -bench.full; 100 without)")

// BenchmarkLapsedBehindHistory measures what a recoverer meets behind a
// history of completed recoverable records, on every store: n completed
// records (storetest.WriteHistory, -history), then one crashed record
// (lease 300ms) and Lapsed(64) until it returns it
// (storetest.PassesUntilLapsed). It reports first (records the first
// Lapsed returned), passes (Lapsed calls until the crashed record came:
// a recoverer used to wait RecoverEvery, 5s, after each that found less
// than a batch) and ms-to-find. Without -bench.full (make test) it writes
// 100 records only. Writing 100,000 records takes minutes on the SQL
// stores and far longer on FerretDB: run it once,
//
//	go test -run '^$' -bench 'LapsedBehindHistory/store=(redis|postgres|mysql)' -benchtime 1x -bench.full -history 1000,100000 .
func BenchmarkLapsedBehindHistory(b *testing.B) {
	sizes, list := []int{}, *historySizes
	if !*full {
		list = "100"
	}
	for f := range strings.SplitSeq(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			b.Fatalf("-history %q: %v", list, err)
		}
		sizes = append(sizes, n)
	}
	for _, sc := range storeCases {
		b.Run("store="+sc.name, func(b *testing.B) {
			for _, n := range sizes {
				b.Run("completed="+strconv.Itoa(n), func(b *testing.B) {
					s, _ := sc.open(b)
					ctx := context.Background()
					start := time.Now()
					if err := storetest.WriteHistory(ctx, s, n); err != nil {
						b.Fatal(err)
					}
					b.Logf("%d completed records written in %v", n, time.Since(start).Round(time.Millisecond))
					b.ResetTimer()
					var first, passes int
					var took time.Duration
					for range b.N {
						f, p, d, err := storetest.PassesUntilLapsed(ctx, s, 64, 100_000, 300*time.Millisecond)
						if err != nil {
							b.Fatal(err)
						}
						first, passes, took = max(first, f), max(passes, p), max(took, d)
					}
					b.ReportMetric(float64(first), "first")
					b.ReportMetric(float64(passes), "passes")
					b.ReportMetric(float64(took.Microseconds())/1000, "ms-to-find")
				})
			}
		})
	}
}
