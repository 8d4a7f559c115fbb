package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
)

// The benchmarks talk to the Redis of IDEM_REDIS_URL (skipped when it is
// unreachable, failed under CI=true). One op is a store call sequence, so
// ns/op is dominated by network round trips.

func benchStore(b *testing.B) *redisstore.Store {
	c := newClient(b)
	return redisstore.New(c, redisstore.WithPrefix(newPrefix(b, c)))
}

// benchResponse is the engine's encoding of a 201 with Content-Type,
// Location and a 66-byte JSON body.
var benchResponse = []byte("\x01\xc9\x01\x02\x0cContent-Type\x01\x10application/json\x08Location\x01\x12/v1/payments/pay_1" +
	`{"id":"pay_1","amount":4200,"currency":"EUR","status":"succeeded"}`)

// BenchmarkAcquireComplete: a first execution, 2 round trips.
func BenchmarkAcquireComplete(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = storetest.Key()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok, err := s.Acquire(ctx, keys[i], "tok", "fp", time.Minute); err != nil || !ok {
			b.Fatal(ok, err)
		}
		if err := s.Complete(ctx, keys[i], "tok", benchResponse, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConflict: a duplicate of a request in progress, 2 round trips
// (SET, then PTTL for Record.LeaseLeft).
func BenchmarkConflict(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	key := storetest.Key()
	if _, ok, err := s.Acquire(ctx, key, "tok", "fp", time.Hour); err != nil || !ok {
		b.Fatal(ok, err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if rec, ok, err := s.Acquire(ctx, key, "other", "fp", time.Minute); err != nil || ok || rec.State != idem.StateInProgress {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkReplay: a duplicate of a completed request, 1 round trip.
func BenchmarkReplay(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	key := storetest.Key()
	if _, ok, err := s.Acquire(ctx, key, "tok", "fp", time.Minute); err != nil || !ok {
		b.Fatal(ok, err)
	}
	if err := s.Complete(ctx, key, "tok", benchResponse, time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rec, ok, err := s.Acquire(ctx, key, "other", "fp", time.Minute)
		if err != nil || ok || rec.Response == nil {
			b.Fatal(rec, ok, err)
		}
	}
}

// BenchmarkParallelDistinct: first executions of distinct keys from
// GOMAXPROCS goroutines sharing one client.
func BenchmarkParallelDistinct(b *testing.B) {
	s := benchStore(b)
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			key := storetest.Key()
			if _, ok, err := s.Acquire(ctx, key, "tok", "fp", time.Minute); err != nil || !ok {
				b.Error(ok, err)
				return
			}
			if err := s.Complete(ctx, key, "tok", benchResponse, time.Minute); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkReplayKept: a duplicate of a request completed under a tombstone
// keep, 2 round trips (SET, then the script reading the response key).
func BenchmarkReplayKept(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	key := storetest.Key()
	if _, ok, err := s.AcquireKeep(ctx, key, "tok", "fp", time.Minute, idem.Keep{Tombstone: time.Hour}); err != nil || !ok {
		b.Fatal(ok, err)
	}
	if err := s.Complete(ctx, key, "tok", benchResponse, time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rec, ok, err := s.Acquire(ctx, key, "other", "fp", time.Minute)
		if err != nil || ok || rec.Response == nil {
			b.Fatal(rec, ok, err)
		}
	}
}

// BenchmarkAcquireCompleteKept: a first execution under Keep{Uncertain,
// Tombstone}, 2 round trips as without a Keep.
func BenchmarkAcquireCompleteKept(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	keep := idem.Keep{Uncertain: time.Hour, Tombstone: time.Hour}
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = storetest.Key()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok, err := s.AcquireKeep(ctx, keys[i], "tok", "fp", time.Minute, keep); err != nil || !ok {
			b.Fatal(ok, err)
		}
		if err := s.Complete(ctx, keys[i], "tok", benchResponse, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConcurrentFresh: first executions (Acquire, Complete) of
// distinct keys from 1 and from 64 goroutines sharing one store, batched
// (the default) and unbatched (WithoutBatching): ns/op is per execution,
// allocations include the batch's share.
func BenchmarkConcurrentFresh(b *testing.B) {
	for _, mode := range []struct {
		name string
		opts []redisstore.Option
	}{{"batched", nil}, {"plain", []redisstore.Option{redisstore.WithoutBatching()}}} {
		for _, workers := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/%d", mode.name, workers), func(b *testing.B) {
				c := newClient(b)
				s := redisstore.New(c, append([]redisstore.Option{redisstore.WithPrefix(newPrefix(b, c))}, mode.opts...)...)
				ctx := context.Background()
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ReportAllocs()
				b.ResetTimer()
				for range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for next.Add(1) <= int64(b.N) {
							key := storetest.Key()
							if _, ok, err := s.Acquire(ctx, key, "tok", "fp", time.Minute); err != nil || !ok {
								b.Error(ok, err)
								return
							}
							if err := s.Complete(ctx, key, "tok", benchResponse, time.Minute); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}
