package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Eviction is what a Redis server reports about its memory limit, read by
// [Store.Eviction].
type Eviction struct {
	// Addr is the server's address, as its client knows it.
	Addr string
	// Policy is the server's maxmemory-policy, e.g. "noeviction" or
	// "allkeys-lru".
	Policy string
	// MaxMemory is the server's maxmemory in bytes; 0 means no limit is set
	// now (a later CONFIG SET maxmemory starts the policy's evictions).
	MaxMemory int64
}

// Evicts reports whether Policy lets the server delete idempotency records
// before their TTL ends: every policy but "noeviction". The allkeys-*
// policies evict any key; the volatile-* policies evict keys that carry a
// TTL, and every record and response key of this package carries one (the
// lease or the retention). An evicted in-progress record lets a duplicate
// execute while the first still runs; an evicted completed record lets a
// retry execute again instead of replaying.
func (e Eviction) Evicts() bool { return e.Policy != "noeviction" }

// Eviction reads maxmemory-policy and maxmemory from every server the store
// writes to (the one server of a standalone or Sentinel client, each master
// of a Cluster) with INFO memory, which managed services answer where they
// disable CONFIG GET. It returns an error when a server cannot be read or
// reports no policy.
func (s *Store) Eviction(ctx context.Context) ([]Eviction, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var out []Eviction
	read := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return fmt.Errorf("redisstore: INFO memory on %s: %w", c.Options().Addr, err)
		}
		e, err := parseEviction(info)
		if err != nil {
			return fmt.Errorf("redisstore: INFO memory on %s: %w", c.Options().Addr, err)
		}
		e.Addr = c.Options().Addr
		out = append(out, e)
		return nil
	}
	var err error
	switch c := s.c.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex // ForEachMaster runs its callbacks concurrently
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return read(ctx, m)
		})
	case *redis.Client:
		err = read(ctx, c)
	default:
		return nil, fmt.Errorf("redisstore: eviction: unsupported client %T", s.c)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// parseEviction reads maxmemory_policy and maxmemory from the text of INFO
// memory ("name:value" lines).
func parseEviction(info string) (Eviction, error) {
	var e Eviction
	for line := range strings.Lines(info) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch name {
		case "maxmemory_policy":
			e.Policy = value
		case "maxmemory":
			if _, err := fmt.Sscan(value, &e.MaxMemory); err != nil {
				return Eviction{}, fmt.Errorf("maxmemory %q: %w", value, err)
			}
		}
	}
	if e.Policy == "" {
		return Eviction{}, fmt.Errorf("no maxmemory_policy in the reply")
	}
	return e, nil
}

// Check reads the servers' eviction policy ([Store.Eviction]) and logs a
// warning with logger (nil: slog.Default()) for each server whose
// maxmemory-policy can evict records ([Eviction.Evicts]): under memory
// pressure, Redis would then delete idempotency records before their TTL
// ends and a retry would execute again. Call it once at start, after [New]
// (New does no I/O); set "maxmemory-policy noeviction" on a Redis that
// holds records (or give them a Redis of their own): at its memory limit,
// such a server refuses writes, the engine answers 503 and nothing runs
// twice. Check returns the error of [Store.Eviction]; a policy that evicts
// is a warning, not an error.
func (s *Store) Check(ctx context.Context, logger *slog.Logger) error {
	evs, err := s.Eviction(ctx)
	if err != nil {
		return err
	}
	if logger == nil {
		logger = slog.Default()
	}
	for _, e := range evs {
		if e.Evicts() {
			logger.LogAttrs(ctx, slog.LevelWarn,
				"redisstore: the Redis server's maxmemory-policy can evict idempotency records before their TTL ends (a retry would then execute again); set maxmemory-policy noeviction",
				slog.String("addr", e.Addr), slog.String("maxmemory_policy", e.Policy), slog.Int64("maxmemory", e.MaxMemory))
		}
	}
	return nil
}
