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
// engine on redisstore (Begin, Write, Finish: a SET and a script run) with
// a bare go-redis client issuing the same number of round trips with plain
// commands of similar size (SET NX PX of a token, SET XX PX of an encoded
// response), at the same concurrency. Throughput ratio = bare ns/op ÷ idem
// ns/op. impl=paired alternates the two in one benchmark (the headline);
// impl=store-paired does the same with the store alone, no engine.
func BenchmarkRedisFloor(b *testing.B) {
	b.Run("impl=idem", func(b *testing.B) {
		c, prefix, trips := newRedisClient(b)
		e := newEngine(b, redisstore.New(c, redisstore.WithPrefix(prefix)))
		runEngine(e, newKey()) // loads the completion script
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
		encoded := benchResponse
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
	// The store alone (Acquire, Complete), without the engine, paired with
	// the same bare commands: what of the paired ratio is the store's.
	b.Run("impl=store-paired", func(b *testing.B) {
		c, prefix, _ := newRedisClient(b)
		s := redisstore.New(c, redisstore.WithPrefix(prefix))
		encoded := benchResponse
		token := "AAAAAAAAAAAAAAAAAAAAAAAAAA"
		fp := "tHKx0Dm4jHuoRu4bMdNjFyCXSWX9Yj2Sn7uNe1g6x8g" // a fingerprint's length
		ctx := context.Background()
		storeOp := func() error {
			k := newKey()
			if _, ok, err := s.Acquire(ctx, k, token, fp, 30*time.Second); err != nil || !ok {
				return fmt.Errorf("Acquire = %v, %w; want acquired", ok, err)
			}
			return s.Complete(ctx, k, token, benchResponse, benchRetention)
		}
		bareOp := func() error {
			k := prefix + newKey()
			if ok, err := c.SetNX(ctx, k, token, 30*time.Second).Result(); err != nil || !ok {
				return fmt.Errorf("SET NX = %v, %w", ok, err)
			}
			return c.SetXX(ctx, k, encoded, benchRetention).Err()
		}
		paired(b, "store", "bare", floorParallelism*runtime.GOMAXPROCS(0), storeOp, bareOp)
	})
	b.Run("impl=bare-go-redis", func(b *testing.B) {
		c, prefix, trips := newRedisClient(b)
		encoded := benchResponse
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
