package benchmarks

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/idemkit/idem/stores/redisstore"
)

// floorParallelism multiplies GOMAXPROCS into the goroutines of
// BenchmarkRedisFloor (b.SetParallelism), the same for both sides.
const floorParallelism = 8

// BenchmarkRedisFloor compares fresh idempotent requests through the
// engine on redisstore (Begin, Write, Finish: two script runs) with a bare
// go-redis client issuing the same number of round trips with plain
// commands of similar size (SET NX PX of a token, SET XX PX of an encoded
// response), at the same concurrency. Throughput ratio = bare ns/op ÷ idem
// ns/op.
func BenchmarkRedisFloor(b *testing.B) {
	b.Run("impl=idem", func(b *testing.B) {
		c, prefix, trips := newRedisClient(b)
		e := newEngine(b, redisstore.New(c, redisstore.WithPrefix(prefix)))
		runEngine(e, newKey()) // loads the scripts
		start := trips.Load()
		b.ReportAllocs()
		b.SetParallelism(floorParallelism)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if code := runEngine(e, newKey()); code != http.StatusCreated {
					b.Errorf("fresh: %s", statusText(code))
					return
				}
			}
		})
		reportTrips(b, trips, start)
	})
	b.Run("impl=paired", func(b *testing.B) {
		c, prefix, _ := newRedisClient(b)
		e := newEngine(b, redisstore.New(c, redisstore.WithPrefix(prefix)))
		runEngine(e, newKey())
		encoded, _ := benchResponse.MarshalBinary()
		token := "AAAAAAAAAAAAAAAAAAAAAAAAAA"
		ctx := context.Background()
		idemOp := func() error {
			if code := runEngine(e, newKey()); code != http.StatusCreated {
				return fmt.Errorf("fresh: %s", statusText(code))
			}
			return nil
		}
		bareOp := func() error {
			k := prefix + newKey()
			if ok, err := c.SetNX(ctx, k, token, 30*time.Second).Result(); err != nil {
				return fmt.Errorf("SET NX: %w", err)
			} else if !ok {
				return fmt.Errorf("SET NX %s = false, want a new key", k)
			}
			return c.SetXX(ctx, k, encoded, benchRetention).Err()
		}
		paired(b, "idem", "bare", floorParallelism*runtime.GOMAXPROCS(0), idemOp, bareOp)
	})
	b.Run("impl=bare-go-redis", func(b *testing.B) {
		c, prefix, trips := newRedisClient(b)
		encoded, _ := benchResponse.MarshalBinary()
		token := "AAAAAAAAAAAAAAAAAAAAAAAAAA" // rand.Text's length
		start := trips.Load()
		b.ReportAllocs()
		b.SetParallelism(floorParallelism)
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				k := prefix + newKey()
				if ok, err := c.SetNX(ctx, k, token, 30*time.Second).Result(); err != nil || !ok {
					b.Errorf("SET NX = %v, %v", ok, err)
					return
				}
				if err := c.SetXX(ctx, k, encoded, benchRetention).Err(); err != nil {
					b.Errorf("SET XX: %v", err)
					return
				}
			}
		})
		reportTrips(b, trips, start)
	})
}
