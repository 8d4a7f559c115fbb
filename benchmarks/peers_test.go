package benchmarks

import (
	"net/http"
	"testing"
	"time"

	idempotencyv2 "github.com/gofiber/fiber/v2/middleware/idempotency"
	idempotencyv3 "github.com/gofiber/fiber/v3/middleware/idempotency"
	redisstorage "github.com/gofiber/storage/redis/v3"

	"github.com/idemkit/idem/benchmarks/internal/floor"
	"github.com/idemkit/idem/benchmarks/internal/harness"
)

// The Go libraries named in issue #27 (github.com/fco-gt/gopotency,
// github.com/bright-room/idem, github.com/repenguin22/idemlease) are not
// served by the module proxy this module builds from (every version: 403
// "not available"), so this module cannot require them; RESULTS.md
// section 2b keeps the record of one run measured outside this tree.
// Here idem on Gin and net/http is paired with internal/floor, the least
// work a correct in-process idempotency middleware does (its doc says
// what it skips).

// newNetHTTPFloor and newGinFloor are the apps of BenchmarkMiddleware on
// net/http and Gin with the floor instead of idem.
func newNetHTTPFloor() driver { return newHTTPDriver(harness.NetHTTPApp(floor.HTTP(floor.New()))) }

func newGinFloor() driver { return newHTTPDriver(harness.GinApp(floor.Gin(floor.New()))) }

// BenchmarkNetHTTPPeer pairs idem on net/http (memory store) with the
// floor middleware, fresh and replay, in alternating chunks of 500 requests
// as BenchmarkFiberPeer does: the ratio idem/builtin is idem ÷ floor.
func BenchmarkNetHTTPPeer(b *testing.B) { benchPeer(b, "nethttp", newNetHTTPFloor) }

// BenchmarkGinPeer pairs idem on Gin (memory store) with the floor, as
// BenchmarkNetHTTPPeer does on net/http.
func BenchmarkGinPeer(b *testing.B) { benchPeer(b, "gin", newGinFloor) }

// keyCounts counts executions per key while set (harness.KeyCounts);
// countKey records one.
var keyCounts = &harness.KeyCounts

func countKey(key string) { harness.CountKey(key) }

// BenchmarkFiberRedisPeer pairs idem on Fiber v2 with redisstore and Fiber
// v2's built-in middleware with gofiber/storage/redis on the same Redis
// (the built-in keeps its process-local lock), fresh and replay.
func BenchmarkFiberRedisPeer(b *testing.B) {
	benchRedisPeer(b, "fiber", func(s *redisstorage.Storage) driver {
		return newFiberDriver(newFiberApp(idempotencyv2.New(idempotencyv2.Config{KeyHeader: floor.Header, Lifetime: 10 * time.Minute, Storage: s})))
	})
}

// BenchmarkFiberV3RedisPeer is BenchmarkFiberRedisPeer on Fiber v3.
func BenchmarkFiberV3RedisPeer(b *testing.B) {
	benchRedisPeer(b, "fiberv3", func(s *redisstorage.Storage) driver {
		return newFasthttpDriver(newFiberV3App(idempotencyv3.New(idempotencyv3.Config{KeyHeader: floor.Header, Lifetime: 10 * time.Minute, Storage: s})).Handler())
	})
}

// benchRedisPeer runs idem with redisstore on framework fwName paired with
// a peer on a Redis storage of its own client, as benchPeer does with
// memory stores.
func benchRedisPeer(b *testing.B, fwName string, peer func(*redisstorage.Storage) driver) {
	var idemFW framework
	for _, fw := range frameworks {
		if fw.name == fwName {
			idemFW = fw
		}
	}
	for _, path := range []string{"fresh", "replay"} {
		b.Run("path="+path, func(b *testing.B) {
			s, _ := openRedis(b)
			c, _, _ := newRedisClient(b)
			ours, theirs := idemFW.build(newEngine(b, s)), peer(redisstorage.NewFromConnection(c))
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
