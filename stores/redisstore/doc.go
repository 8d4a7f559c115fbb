// Package redisstore is an [idem.Store] on Redis, shared by every instance of
// a service: standalone Redis, Sentinel failover (redis.NewFailoverClient) or
// Redis Cluster (redis.NewClusterClient), through go-redis v9.
//
// # Layout
//
// Each record is one Redis string at prefix+key (default prefix "idem:"; the
// key is the engine's 64-hex scoped key). With lp(s) = len(s) in decimal,
// ':' and s:
//
//	in-progress  '1' lp(token) lp(fingerprint)
//	completed    '2' lp(fingerprint) response
//
// where response is the bytes the engine gave Complete ([idem.Record]),
// to the end of the value (binary-safe); the token is dropped at
// completion. Records acquired under a non-zero [idem.Keep]
// ([Store.AcquireKeep]) carry it:
//
//	in-progress  '3' lp(token) lp(fingerprint) lp(u) lp(t)   TTL lease + u
//	completed    '4' lp(fingerprint) lp(t)                   TTL retention + t
//
// with u and t the Keep's Uncertain and Tombstone in decimal milliseconds.
// A '3' record is uncertain once its PTTL is at most u. A '4' record's
// response is in its response key, prefix+key+":r{"+prefix+key+"}" (or
// prefix+key+":r" when the prefix holds a Cluster hash tag), with TTL
// retention: the record is completed while that key lives and a tombstone
// after, until its own TTL ends.
//
// The lease of an in-progress record and the retention of a completed one are
// the key's TTL, kept by the Redis server's clock in milliseconds: a lapsed
// lease or an ended retention is simply a key Redis has expired. Durations are
// rounded up to whole milliseconds (a 1µs lease becomes 1ms).
//
// # Atomicity and round trips
//
// Acquire is one command, SET key value NX GET PX lease: it writes the
// in-progress value when the key is absent (or expired) and otherwise
// returns the live value unchanged. Complete (owner and in-progress
// checked, then SET of the completed value PX retention), Release (owner
// checked, DEL) and Extend (owner checked, PEXPIRE) are one Lua script each,
// run with EVALSHA (EVAL when the server's script cache is empty, e.g.
// after a restart). Every command and script touches only its record's key
// (and its response key, in the same Cluster slot), so each transition is
// atomic on the server and Cluster-safe, with no WATCH and no
// check-then-set across round trips. A first execution costs 2
// round trips (acquire, complete); a replay, a 409 conflict or a 422
// mismatch costs 1. Get is one GET.
//
// # Step journal
//
// The store is an [idem.Journal], for [idem.Step]. A record's journal is a
// hash at its journal key, prefix+key+":j{"+prefix+key+"}" (or
// prefix+key+":j" when the prefix holds a Cluster hash tag), in the
// record's slot: one field per step, named after it, holding its index,
// done flag, lp(token) and result. StartStep, FinishStep and Suspend are
// one script run each (one round trip, the result sent once: about
// len(result) + 30 bytes stored per step, plus the step's name). Its first
// step turns the record into
//
//	in-progress  '5' lp(token) lp(fingerprint) lp(u) lp(t) lp(r)   TTL lease + (u, else r)
//
// with r the journal's retain in milliseconds: once its lease lapses the
// record stays, in progress, for r (uncertain instead under
// Keep.Uncertain), fenced against its old token, and an Acquire with its
// fingerprint takes it over with one more script run (the SET, then a
// script that checks the lapse and rewrites the record, keeping the
// journal), reporting the previous token; another fingerprint gets the
// record answered. Every script that writes a record with a journal gives
// the journal the record's expiry (PEXPIRETIME, PEXPIREAT: the same
// millisecond), or, once completed under a tombstone keep, its response
// key's, so the journal lives and dies with its record; Release, Resolve
// with no response and Evict delete it. Complete, Release and Extend of a
// '5' record cost one more round trip (their one-key script answers that
// the journal key is needed); records without steps are written and read
// as before, at the same cost. Lapsed records without a journal expire
// with their lease as before, so their takeover is not reported.
//
// # Recovery
//
// The store is an [idem.Recoverable]: a record's recovery payload is a
// field of its journal, and the records due for recovery are found through
// the recovery index, a sorted set at prefix+"recovery" scored by the time
// each record is due (its lease's end plus its last claim's backoff). The
// index holds only records that may need recovery: SetRecovery adds the
// record, Extend, takeovers and Claim move it, and Complete, Release,
// Suspend, Evict and Resolve remove it, each in the script of the
// transition itself, atomically with it (a resent script finds the record
// changed and leaves the index alone). So the entries whose time came are
// the due records, and [Store.Lapsed] (ZRANGE BYSCORE -inf now LIMIT, then
// a check of each entry's record) and [Store.Claim] (one script) cost what
// the due records cost, never what the completed history holds
// (benchmarks/RESULTS.md: one Lapsed finds a crashed record behind 100,000
// completed ones). Entries a transition cannot reach (a record expired
// while due) are removed by Lapsed when it meets them, and Lapsed looks
// past them. Scripts declare every key they touch, so the index must share
// the records' Redis Cluster slot: it does on standalone Redis, Sentinel,
// and Cluster with a prefix holding a hash tag. On Cluster with a prefix
// without a hash tag (the index in a slot of its own), the index is kept
// by one more command after the transitions that end a record's recovery,
// and moved by Lapsed after the others; index.go has the details.
//
// # Failures
//
// Connection errors, timeouts, LOADING, READONLY and failover errors are
// returned wrapped ("redisstore: acquire: ...") and the engine answers 503;
// the borrowed client reconnects on its own, so calls succeed again once
// Redis is back, with no restart.
//
// # Durability
//
// Redis replicates asynchronously: a failover can lose a record written just
// before it, and a retry then executes again. [WithWaitReplicas] narrows that
// window for completed records when a primary dies, and reports the
// completions it could not confirm, at the cost of one WAIT per completion;
// it does not close the window of a planned SENTINEL FAILOVER, in which the
// old primary keeps taking writes until the clients switch (README.md has
// the measurements).
//
// # Eviction
//
// Every record and response key carries a TTL, so any maxmemory-policy but
// noeviction (allkeys-* and volatile-* alike) lets a Redis at its memory
// limit delete records before their lease or retention ends: a duplicate
// then executes while the first still runs, or a retry executes again
// instead of replaying. Give records a Redis with maxmemory-policy
// noeviction (at its limit it refuses writes: the engine answers 503 and
// nothing runs twice), and call [Store.Check] at start: it logs a warning
// for a server whose policy can evict ([Store.Eviction] reads it).
//
// Ring clients (redis.NewRing) are not supported: a Ring moves keys when a
// shard goes down, so two instances may see different records.
package redisstore
