package redisstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/stores/redisstore"
)

// TestCheckEviction starts a Redis server per maxmemory-policy and checks
// that Check warns exactly when the policy can evict records: every
// allkeys-* and volatile-* policy (records carry TTLs), never noeviction.
func TestCheckEviction(t *testing.T) {
	for _, tc := range []struct {
		policy string
		warn   bool
	}{
		{"allkeys-lru", true},
		{"volatile-ttl", true},
		{"noeviction", false},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Parallel()
			srv := startRedisT(t, freePort(t), "--maxmemory", "64mb", "--maxmemory-policy", tc.policy)
			c := redis.NewClient(&redis.Options{Addr: srv.addr, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			store := redisstore.New(c)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			evs, err := store.Eviction(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != 1 || evs[0].Policy != tc.policy || evs[0].MaxMemory != 64<<20 || evs[0].Addr != srv.addr || evs[0].Evicts() != tc.warn {
				t.Fatalf("Eviction = %+v, want one server %s with policy %s, maxmemory %d, Evicts %v", evs, srv.addr, tc.policy, 64<<20, tc.warn)
			}
			var logs bytes.Buffer
			if err := store.Check(ctx, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
				t.Fatal(err)
			}
			warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "maxmemory_policy="+tc.policy)
			if warned != tc.warn {
				t.Fatalf("policy %s: warned = %v, want %v; log:\n%s", tc.policy, warned, tc.warn, logs.String())
			}
			if !tc.warn {
				// The policy is read live: a server switched to an evicting
				// policy at run time is reported by the next Check.
				if err := c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lfu").Err(); err != nil {
					t.Fatal(err)
				}
				logs.Reset()
				if err := store.Check(ctx, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(logs.String(), "maxmemory_policy=allkeys-lfu") {
					t.Fatalf("after CONFIG SET maxmemory-policy allkeys-lfu: no warning; log:\n%s", logs.String())
				}
			}
		})
	}
}

// TestCheckEvictionCluster reads every master of a Redis Cluster (their
// default policy, noeviction: no warning).
func TestCheckEvictionCluster(t *testing.T) {
	c := newClusterClient(t)
	store := redisstore.New(c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	evs, err := store.Eviction(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32 // ForEachMaster runs its callbacks concurrently
	if err := c.ForEachMaster(ctx, func(context.Context, *redis.Client) error { n.Add(1); return nil }); err != nil {
		t.Fatal(err)
	}
	if masters := int(n.Load()); len(evs) != masters || masters == 0 {
		t.Fatalf("Eviction read %d servers, the cluster has %d masters: %+v", len(evs), n.Load(), evs)
	}
	var logs bytes.Buffer
	if err := store.Check(ctx, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Evicts() != strings.Contains(logs.String(), "addr="+e.Addr) {
			t.Fatalf("server %+v: warning logged = %v; log:\n%s", e, !e.Evicts(), logs.String())
		}
	}
}

// TestCheckUnreachable: a server that cannot be read is an error, not a
// silent pass.
func TestCheckUnreachable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(freePort(t)), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := redisstore.New(c).Check(ctx, nil); err == nil || !strings.Contains(err.Error(), "INFO memory") {
		t.Fatalf("Check on a closed port = %v, want an INFO memory error", err)
	}
}
