// Package mongostore is an [idem.Store] on a MongoDB collection, shared by
// every instance of a service, so that each idempotency key executes at most
// once across all of them.
//
// # Records
//
// One document per scoped key:
//
//	{ _id: <hashed scoped key, 64 hex>, state: 1 (in-progress) | 2 (completed),
//	  token: <owner token>, gen: <generation, random, new with each owner>,
//	  fingerprint: <request fingerprint>,
//	  expiresAt: <BSON date: end of the lease or of retention>,
//	  response: <BSON binary, completed records only> }
//
// The only operation the store relies on being atomic is the insert of a
// unique _id, so it is exactly-once on every MongoDB-wire server, including
// FerretDB, whose conditional updates are not atomic. Acquire is one
// findAndModify with upsert and $setOnInsert, which inserts the in-progress
// record when the key is free and otherwise returns the existing record
// unchanged. An expired record (lapsed lease or retention over) is taken over
// by inserting a claim document whose _id is the key and the generation of the
// version read: of any number of racing takeovers exactly one insert succeeds;
// the winner then rewrites that version of the record, and the losers answer
// from the claim, which names the winner. Release and Purge claim the version
// before deleting it. Complete and Extend are one update filtered on _id, the
// owner token, state in-progress and expiresAt > now. Every read treats
// expiresAt <= now as absent, because the TTL monitor deletes expired
// documents only about once a minute.
//
// # Uncertain records and tombstones
//
// The store is an [idem.Keeper]. A record acquired under a non-zero
// [idem.Keep] also holds until (end of the lease or retention), keepU and
// keepT (the keep in milliseconds), and its expiresAt is until plus the keep
// of its state: past until and before expiresAt an in-progress record is
// uncertain and a completed one a tombstone, answered by Acquire and never
// taken over. A tombstone's response is freed by the first read that finds
// it and by [Store.Purge]. Records acquired without a Keep keep the layout
// above.
//
// The response is stored as one BSON binary field holding the bytes the
// engine gave Complete ([idem.Record]), exactly: BSON strings must be valid
// UTF-8, header values need not be.
//
// # Step journal
//
// The store is an [idem.Journal], for [idem.Step]. A record's journal is
// part of its document, so it lives and dies with it:
//
//	{ ..., until: <lease end>, retain: <ms>, nsteps: <n>,
//	  steps: { <hex of the name>: { i: <index>, t: <token>, d: <done>, r: <result, binary> } } }
//
// Its first step sets until and moves expiresAt to until + retain (or +
// keepU under Keep.Uncertain): past until the record is kept in progress,
// its old token fenced out (every owner filter then requires until > now),
// and an Acquire with its fingerprint takes it over through the same claim
// as an expired record, keeping the journal and reporting the previous
// token; another fingerprint gets the record answered. Complete keeps the
// journal until the retention ends (a tombstone's is freed with its
// response); Release, Resolve with no response, Evict and expiry delete
// it with the document. StartStep is one update (find + update for the
// first step of a record, or a step already journaled: one find);
// FinishStep one update; Suspend a find and an update; Steps one find.
// Records without steps keep their layout and round trips.
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
// expired record: 2 more (claim, rewrite). Release: 3 (read, claim, delete).
// Plus one hello per store per clock refresh interval.
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
// # Recovery
//
// Store is an [idem.Recoverable]: the records due for recovery are found
// through the sparse index on dueAt, when to look at a record with a
// recovery payload (its lease's end plus the last claim's backoff, as of
// its last SetRecovery, Claim or ResolveStep). Complete, Resolve and any
// takeover that drops the payload unset it, Release, Evict and the purger
// delete the record: a completed record is never in the index, which
// holds the records in flight with a payload and the due ones. Extend,
// Suspend and a client's takeover leave dueAt as it was; [Store.Lapsed]
// moves (or unsets) the dueAt of those it meets and looks further, so they
// never hide a due record. [Store.Claim] reads and rewrites one record.
// Both cost what the due and in-flight records cost, whatever the history.
//
// # FerretDB
//
// The store runs on FerretDB v1 (the test server in tools/ferretdb) and
// passes the whole conformance suite there. Its limits: it rejects TTL
// indexes, so [Store.EnsureIndexes] logs and relies on [Store.Purge]; an
// owner's Complete or Extend racing the takeover of its lapsed lease can
// replace the new owner's record (never making a third request execute); and
// its SQLite backend scans the collection on every lookup. The README states
// both precisely, with the tests and benchmarks that show them.
package mongostore
