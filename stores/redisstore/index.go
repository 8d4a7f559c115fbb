package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// The recovery index ([idem.Recoverable]) is one sorted set per store, at
// prefix+"recovery": member a record's scoped key, score the time (µs, the
// Redis server's clock) at which the record is due for recovery if its
// holder stops, that is its lease's end plus the backoff of its last
// claim. It holds the records that may need recovery, and no others:
//
//   - SetRecovery adds the record at its lease's end; Extend, a client's
//     takeover (Acquire with its fingerprint) and Claim move it to the new
//     lease's end (plus the claim's backoff); ResolveStep to now;
//   - Complete, Release, Suspend (parking), Evict and Resolve remove it,
//     as does a takeover under Keep.Uncertain;
//
// each in the script of the transition itself, atomically with it (the
// script declares the index as its fourth key, the record's scoped key
// as its last argument). A script sent twice (a resent pipeline) finds the
// record changed and leaves the index as the first run left it.
//
// So the entries whose time came (ZRANGE BYSCORE -inf now) are records
// due now, and the few a transition could not reach: a record that
// expired (its retain ended while it was due and nobody claimed it). A
// completed record never stands in front of a due one, whatever the
// history: Lapsed reads the due entries first and costs what the due
// records cost. Lapsed still checks each entry it answers against its
// record (dueScript) and moves or removes the entries that are not due,
// looking further until it has limit due records or has seen every entry
// whose time came (bounded by [lapsedBudget]).
//
// Every key of a script must share one Redis Cluster slot. On standalone
// Redis, Sentinel, and Redis Cluster with a prefix holding a hash tag
// (every key in the tag's slot) the index is in every record's script.
// On Redis Cluster with a prefix without a hash tag, each record lives in
// a slot of its own, apart from the index: there SetRecovery adds the
// entry in the same pipeline as its script (the instance's clock), and
// Complete, Release, Suspend, Evict and Resolve of a record with a step
// journal remove it with one more command once their script succeeded
// (one more round trip); Extend, takeovers and Claim leave the entry where
// it was, and Lapsed moves it to the record's due time when it meets it.
// An entry lost between a script and its index command is found by
// Lapsed, as an expired record's is.

// luaIndex defines unindex() and schedule(ms): remove the record's entry
// from the recovery index, or place it ms from now (the server's clock),
// when the script was given the index (KEYS[4], member ARGV[#ARGV]).
const luaIndex = `
local function unindex()
  if KEYS[4] then
    redis.call('ZREM', KEYS[4], ARGV[#ARGV])
  end
end
local function schedule(ms)
  if KEYS[4] then
    local tm = redis.call('TIME')
    local at = tonumber(tm[1]) * 1000000 + tonumber(tm[2]) + math.max(tonumber(ms), 0) * 1000
    redis.call('ZADD', KEYS[4], string.format('%d', at), ARGV[#ARGV])
  end
end
`

// rangeScript: KEYS the recovery index; ARGV offset, count. It returns
// the members and scores (flat) of up to count entries whose time came by
// the server's clock, soonest first, after offset of them. A read: safe
// twice.
var rangeScript = newScript(`
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
return redis.call('ZRANGE', KEYS[1], '-inf', string.format('%d', now), 'BYSCORE', 'LIMIT', ARGV[1], ARGV[2], 'WITHSCORES')
`)

// indexed reports whether the recovery index shares every record's slot,
// so that the record's scripts keep it: any client but a Cluster client
// with a prefix without a hash tag.
func (s *Store) indexed() bool {
	_, cluster := s.c.(*redis.ClusterClient)
	return !cluster || s.tagged
}

// withIndex returns the keys and arguments of a script that keeps the
// recovery index: keys (the record's journal keys) and the index, args
// and the record's scoped key, where the index shares the record's slot;
// else keys and args as they are.
func (s *Store) withIndex(keys []string, key string, args []any) ([]string, []any) {
	if !s.indexed() {
		return keys, args
	}
	return append(keys[:len(keys):len(keys)], s.indexKey()), append(args[:len(args):len(args)], key)
}

// unindex removes key's entry from the recovery index where the record's
// scripts cannot (see withIndex), after a transition that ended the
// record's recovery (completed, released, suspended, evicted, resolved).
// A failure leaves the entry for Lapsed, which removes it when it meets
// it: it is not reported.
func (s *Store) unindex(ctx context.Context, key string) {
	if s.indexed() {
		return
	}
	_ = s.c.ZRem(ctx, s.indexKey(), key).Err()
}
