// Package harness is what the benchmarks of this module share: the request and response of every framework case, UUID-shaped keys, the
// net/http and Gin apps with their handler, the in-process HTTP driver,
// paired measurement in alternating chunks, engines on memstore and
// redisstore, and the count of executions under concurrent duplicates.
// Not for production.
package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// Shared request and response of every framework case: a small JSON charge
// POSTed to Route by Principal, answered 201 with a small JSON body.
var (
	ReqBody  = []byte(`{"amount":4200,"currency":"EUR"}`)
	RespBody = []byte(`{"id":"pay_1","amount":4200,"currency":"EUR","status":"succeeded"}`)
)

const (
	// Route is the route (and path) of every framework case.
	Route = "/v1/payments"
	// Principal is the caller every request is sent as (header X-User-Id)
	// and the scope idem and the peers that can scope are given.
	Principal = "user_1"
	// Retention is the retention of engines built by NewEngine and of the
	// peers' records: long enough that nothing expires during a run.
	Retention = 10 * time.Minute
)

// RunID makes keys and Redis prefixes unique across processes sharing a
// Redis or MongoDB.
var RunID = func() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

var keySeq atomic.Uint64

// Seq returns the next number of a sequence shared by NewKey and the Redis
// prefixes: unique within the process.
func Seq() uint64 { return keySeq.Add(1) }

// NewKey returns a fresh UUID-shaped idempotency key (36 characters, as
// Fiber's built-in middleware demands): one allocation.
func NewKey() string {
	var b [36]byte
	copy(b[:], "00000000-0000-4000-8000-000000000000")
	copy(b[:6], RunID)
	n := Seq()
	for i := 35; i > 23 && n > 0; i-- {
		b[i] = "0123456789abcdef"[n&15]
		n >>= 4
	}
	return string(b[:])
}

// RequireEnv returns the environment variable name, or skips tb when it is
// unset (fails instead under CI=true).
func RequireEnv(tb testing.TB, name string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s is not set (CI=true)", name)
		}
		tb.Skipf("%s is not set; run through make bench", name)
	}
	return v
}

// NewMemEngine returns an engine on a fresh memstore that never fills up
// during a benchmark and starts no janitor.
func NewMemEngine(tb testing.TB, opts ...idem.Option) (*idem.Engine, *memstore.Store) {
	tb.Helper()
	s := memstore.New(memstore.WithMaxRecords(1<<40), memstore.WithCleanupInterval(0))
	tb.Cleanup(func() { s.Close() })
	e, err := idem.New(s, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return e, s
}

// NewEngine returns an engine on s with Retention.
func NewEngine(tb testing.TB, s idem.Store) *idem.Engine {
	tb.Helper()
	e, err := idem.New(s, idem.WithRetention(Retention))
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// tripHook counts every command and pipeline a go-redis client sends: one
// round trip each.
type tripHook struct{ n *atomic.Int64 }

func (h tripHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h tripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h tripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// NewRedisClient returns a client of the Redis at IDEM_REDIS_URL counting
// its round trips, and a fresh key prefix whose keys are deleted at
// cleanup (with the client's close).
func NewRedisClient(tb testing.TB) (*redis.Client, string, *atomic.Int64) {
	tb.Helper()
	opts, err := redis.ParseURL(RequireEnv(tb, "IDEM_REDIS_URL"))
	if err != nil {
		tb.Fatal(err)
	}
	c := redis.NewClient(opts)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		tb.Fatalf("redis at IDEM_REDIS_URL: %v", err)
	}
	prefix := fmt.Sprintf("idembench:%s:%d:", RunID, Seq())
	trips := new(atomic.Int64)
	c.AddHook(tripHook{trips})
	tb.Cleanup(func() {
		DeletePrefix(c, prefix)
		c.Close()
	})
	return c, prefix, trips
}

// DeletePrefix unlinks every key of c's database starting with prefix.
func DeletePrefix(c *redis.Client, prefix string) {
	ctx := context.Background()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 1000 {
			c.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Unlink(ctx, batch...)
	}
}

// OpenRedis returns a redisstore on a client of NewRedisClient.
func OpenRedis(tb testing.TB) (idem.Store, *atomic.Int64) {
	c, prefix, trips := NewRedisClient(tb)
	return redisstore.New(c, redisstore.WithPrefix(prefix)), trips
}
