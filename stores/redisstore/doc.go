// Package redisstore is an [idem.Store] on Redis, shared by every instance of
// a service: standalone Redis, Sentinel failover (redis.NewFailoverClient) or
// Redis Cluster (redis.NewClusterClient), through go-redis v9.
//
// # Layout
//
// Each record is one Redis hash at prefix+key (default prefix "idem:"; the key
// is the engine's 64-hex scoped key) with the fields
//
//	s  state: "1" in-progress, "2" completed
//	t  owner token (in-progress only; dropped on completion)
//	f  fingerprint of the request that created the record
//	r  the response, encoded by [idem.Response.AppendBinary] (completed only)
//
// The lease of an in-progress record and the retention of a completed one are
// the key's TTL, kept by the Redis server's clock in milliseconds: a lapsed
// lease or an ended retention is simply a key Redis has expired. Durations are
// rounded up to whole milliseconds (a 1µs lease becomes 1ms).
//
// # Atomicity and round trips
//
// Every state transition is one Lua script run with EVALSHA (EVAL when the
// server's script cache is empty, e.g. after a restart), touching only
// KEYS[1], so it is atomic on the server and Cluster-safe: acquire
// (create, or return the live record), complete (owner and in-progress
// checked, then PEXPIRE retention), release (owner checked, DEL) and extend
// (owner checked, PEXPIRE). There is no WATCH and no check-then-set across
// round trips. A first execution costs 2 round trips (acquire, complete); a
// replay, a 409 conflict or a 422 mismatch costs 1. Get is one HMGET.
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
// Ring clients (redis.NewRing) are not supported: a Ring moves keys when a
// shard goes down, so two instances may see different records.
package redisstore
