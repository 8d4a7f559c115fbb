package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
)

// TestRecoveryIndexBounded: the recovery index holds the records that may
// need recovery and no others. 500 completed recoverable records leave no
// entry; 5 in flight with a payload hold 5, one each; once 2 of them are
// completed, one released and one parked (Suspend) it holds 1; on
// standalone Redis and on Redis Cluster with and without a hash tag.
func TestRecoveryIndexBounded(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, c redis.UniversalClient, prefix string) {
		s := redisstore.New(c, redisstore.WithPrefix(prefix))
		ctx := context.Background()
		size := func() int64 {
			t.Helper()
			n, err := c.ZCard(ctx, prefix+"recovery").Result()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		if err := storetest.WriteHistory(ctx, s, 500); err != nil {
			t.Fatal(err)
		}
		if n := size(); n != 0 {
			t.Fatalf("recovery index after 500 completed records: %d entries; want 0", n)
		}
		keys, toks := make([]string, 5), make([]string, 5)
		for i := range keys {
			keys[i], toks[i] = storetest.Key(), storetest.Token()
			if _, ok, err := s.Acquire(ctx, keys[i], toks[i], "fp", time.Minute); err != nil || !ok {
				t.Fatalf("Acquire: %v, %v", ok, err)
			}
			if err := s.SetRecovery(ctx, keys[i], toks[i], []byte("payload"), time.Hour, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		if n := size(); n != 5 {
			t.Fatalf("recovery index with 5 records in flight: %d entries; want 5", n)
		}
		for i := range 2 {
			if err := s.Complete(ctx, keys[i], toks[i], []byte("resp"), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Release(ctx, keys[2], toks[2]); err != nil {
			t.Fatal(err)
		}
		if err := s.Suspend(ctx, keys[3], toks[3], time.Hour); err != nil {
			t.Fatal(err)
		}
		if n := size(); n != 1 {
			t.Fatalf("recovery index after completing 2, releasing 1 and parking 1 of 5: %d entries; want 1", n)
		}
	}
	t.Run("Standalone", func(t *testing.T) {
		t.Parallel()
		c := newClient(t)
		check(t, c, newPrefix(t, c))
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		c := newClusterClient(t)
		t.Run("Untagged", func(t *testing.T) { check(t, c, newPrefix(t, c)) })
		t.Run("Tagged", func(t *testing.T) {
			p := newPrefix(t, c)
			check(t, c, p+"{"+p+"}:")
		})
	})
}
