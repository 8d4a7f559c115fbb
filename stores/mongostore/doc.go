// Package mongostore is an [idem.Store] on a MongoDB collection, shared by
// every instance of a service, so that each idempotency key executes at most
// once across all of them.
//
// # Records
//
// One document per scoped key:
//
//	{ _id: <hashed scoped key, 64 hex>, state: 1 (in-progress) | 2 (completed),
//	  token: <owner token>, fingerprint: <request fingerprint>,
//	  expiresAt: <BSON date: end of the lease or of retention>,
//	  response: <BSON binary, completed records only> }
//
// The unique _id is the lock: Acquire is one findAndModify with upsert and
// $setOnInsert, which inserts the in-progress record when the key is free and
// otherwise returns the existing record unchanged. An expired record (lapsed
// lease or retention over) is taken over by one conditional update filtered on
// _id, the old token and the old expiresAt, so of two racing takeovers only one
// matches. Complete, Release and Extend are filtered on _id, the owner token,
// state in-progress and expiresAt > now. Every read treats expiresAt <= now as
// absent, because the TTL monitor deletes expired documents only about once a
// minute.
//
// The response is stored as one BSON binary field holding
// [idem.Response.AppendBinary]'s encoding: BSON strings must be valid UTF-8,
// header values need not be, and the encoding keeps multiple values per header
// name, their order and the exact body bytes, in one allocation-light field
// shared with the other byte-oriented stores.
//
// # Time
//
// Leases and retention are decided against the server's clock, which every
// instance agrees on: the offset between the local clock and the localTime of
// the server's hello reply is measured on first use (not in [New]) and
// refreshed every [WithClockRefresh], and the corrected local time goes into
// every filter. No $$NOW, $expr or pipeline updates are used, so the store also
// runs on servers that lack them (FerretDB v1).
//
// # Round trips
//
// First execution: 2 (findAndModify that inserts, update on completion).
// Replay, conflict (in progress) and fingerprint mismatch: 1. Takeover of an
// expired record: 1 more. Plus one hello per store per clock refresh
// interval.
//
// # Write concern and read preference
//
// They are the caller's: set them on the collection given to [New]. For
// payments use majority write concern, so an acknowledged lock or response
// survives a failover, and primary reads, so that Get sees the latest
// record (findAndModify, used by Acquire, always runs on the primary).
//
// # Driver v2
//
// The store uses go.mongodb.org/mongo-driver/v2, since the v1 driver is in
// maintenance mode (security fixes only). A service still on v1 adopts it by
// importing go.mongodb.org/mongo-driver/v2/mongo for the client that backs
// the idempotency collection: the two module paths differ, so the v1 and v2
// drivers coexist in one binary during a migration, each with its own client.
//
// # FerretDB
//
// The store runs on FerretDB v1 (the test server in tools/ferretdb) with two
// limits: it rejects TTL indexes, so [Store.EnsureIndexes] logs and relies on
// [Store.Purge]; and its conditional updates are not atomic under concurrency
// (read, then write by _id), so racing takeovers of one expired record, or a
// purge racing a takeover, are only safe on a real MongoDB. Racing acquires of
// a free key are safe on both, since they rest on the unique _id insert.
package mongostore
