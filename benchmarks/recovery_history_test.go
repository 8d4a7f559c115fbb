package benchmarks

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/benchmarks/internal/harness"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
	"github.com/idemkit/idem/tools/history"
)

var historySizes = flag.String("history", "100000,1000000", "comma-separated numbers of completed records BenchmarkLapsedBehindHistory seeds before its crashed record (with -bench.full; 100 without)")

// historyCase opens one store for BenchmarkLapsedBehindHistory with the
// tools/history Cloner that copies its records in the store's server (nil:
// written through the Store API).
type historyCase struct {
	name string
	open func(tb testing.TB) (idem.Store, history.Cloner)
}

var historyCases = []historyCase{
	{"memory", func(tb testing.TB) (idem.Store, history.Cloner) { s, _ := openMem(tb); return s, nil }},
	{"redis", func(tb testing.TB) (idem.Store, history.Cloner) {
		c, prefix, _ := newRedisClient(tb)
		return redisstore.New(c, redisstore.WithPrefix(prefix)), history.Redis(c, prefix)
	}},
	{"redis-cluster", openRedisCluster},
	{"postgres", func(tb testing.TB) (idem.Store, history.Cloner) {
		s, pool, table, _ := newPgStore(tb, 4*runtime.GOMAXPROCS(0))
		return s, history.Postgres(pool, table)
	}},
	{"mysql", func(tb testing.TB) (idem.Store, history.Cloner) {
		s, db, table, _ := newMyStore(tb, 4*runtime.GOMAXPROCS(0))
		return s, history.MySQL(db, table)
	}},
	{"mongo", func(tb testing.TB) (idem.Store, history.Cloner) {
		s, coll, _ := newMongoStore(tb)
		return s, history.Mongo(coll)
	}},
}

// openRedisCluster opens a redisstore on the Redis Cluster whose seed
// addresses IDEM_REDIS_CLUSTER_ADDRS lists (comma-separated; skipped
// without: scripts/services.sh starts none), under a fresh prefix without
// a hash tag (records spread over every master), deleted at cleanup.
func openRedisCluster(tb testing.TB) (idem.Store, history.Cloner) {
	addrs := os.Getenv("IDEM_REDIS_CLUSTER_ADDRS")
	if addrs == "" {
		tb.Skip("IDEM_REDIS_CLUSTER_ADDRS is not set: no Redis Cluster to measure")
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		tb.Fatalf("redis cluster at IDEM_REDIS_CLUSTER_ADDRS: %v", err)
	}
	prefix := fmt.Sprintf("idembench:%s:%d:", harness.RunID, harness.Seq())
	tb.Cleanup(func() {
		_ = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			harness.DeletePrefix(m, prefix)
			return nil
		})
		_ = c.Close()
	})
	return redisstore.New(c, redisstore.WithPrefix(prefix)), history.Redis(c, prefix)
}

// BenchmarkLapsedBehindHistory measures what a recoverer meets behind a
// history of completed recoverable records, on every store: n completed
// records (tools/history.Seed: one through the Store API, the rest copied
// by the store's server; memory: all through the Store API), then one
// crashed record (lease 300ms) and Lapsed(64) until it returns it
// (storetest.PassesUntilLapsed). It reports first (records the first
// Lapsed returned), passes (Lapsed calls until the crashed record came:
// a recoverer used to wait RecoverEvery, 5s, after each that found less
// than a batch), ms-to-find, and s-to-seed (the seeding's time). Without
// -bench.full (make test) it seeds 100 records only. Seeding 1,000,000
// takes tens of seconds to minutes per store: run the stores one after
// another,
//
//	go test -run '^$' -bench 'LapsedBehindHistory/store=postgres/' -benchtime 1x -bench.full -history 100000,1000000 .
//
// The redis-cluster case needs IDEM_REDIS_CLUSTER_ADDRS (seed addresses
// of a Redis Cluster), and is skipped without.
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
	for _, hc := range historyCases {
		b.Run("store="+hc.name, func(b *testing.B) {
			for _, n := range sizes {
				b.Run("completed="+strconv.Itoa(n), func(b *testing.B) {
					s, clone := hc.open(b)
					ctx := context.Background()
					start := time.Now()
					if _, err := history.Seed(ctx, s, clone, n); err != nil {
						b.Fatal(err)
					}
					seeded := time.Since(start)
					b.Logf("%d completed records seeded in %v", n, seeded.Round(time.Millisecond))
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
					b.ReportMetric(seeded.Seconds(), "s-to-seed")
				})
			}
		})
	}
}
