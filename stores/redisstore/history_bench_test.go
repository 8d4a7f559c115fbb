package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storetest"
)

// BenchmarkLapsedBehindHistory measures what a recoverer meets behind a
// history of completed recoverable records: one crashed record (lease
// 300ms) behind 1,000 and 100,000 completed ones, then Lapsed(64) until it
// returns it. It reports first (records the first Lapsed returned),
// passes (Lapsed calls until the crashed record came: at the default
// RecoverEvery a recoverer waits 5s between passes that found less than
// a batch) and ms-to-find. Writing the history takes seconds to minutes:
// run it once,
//
//	go test -run '^$' -bench LapsedBehindHistory -benchtime 1x ./stores/redisstore
func BenchmarkLapsedBehindHistory(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run("completed="+strconv.Itoa(n), func(b *testing.B) {
			s := benchStore(b)
			ctx := context.Background()
			if err := storetest.WriteHistory(ctx, s, n); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			var first, passes int
			var took time.Duration
			for range b.N {
				f, p, d, err := storetest.PassesUntilLapsed(ctx, s, 64, 10_000, 300*time.Millisecond)
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
}
