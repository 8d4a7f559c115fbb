// Package pgstore is an [idem.Store] on PostgreSQL through pgx v5
// (pgxpool), shared by every instance of a service, with transactional
// completion: a handler's writes to the same database commit in one
// transaction with its completed record, or not at all.
//
// # Layout
//
// One table (default "idem_records", see [WithTable]) with one row per
// record, primary key on the engine's scoped key, and an index on
// expires_at for [Store.Purge]. Create it with [Store.EnsureSchema] at
// startup, or run [Store.SchemaSQL] in a migration.
//
// # Atomicity, time and round trips
//
// Every transition is one statement: acquire is an INSERT … ON CONFLICT
// that creates the record, takes over one whose lease lapsed, or returns
// the live record in the same round trip; complete, release and extend
// are UPDATE or DELETE statements conditional on the token, the
// in-progress state and a live lease. Leases and retention are counted
// by the server's clock (clock_timestamp(), microseconds), never the
// instance's. A first execution costs 2 round trips (acquire, complete);
// a replay, a 409 conflict or a 422 mismatch 1.
//
// # Transactional completion
//
// A handler calls [Tx] with its request context to get the execution's
// pgx.Tx (begun on first use) and writes through it. The engine runs the
// completion UPDATE, conditional on the execution still holding its
// lease, in that transaction and commits it; when the response is not
// stored (5xx, handler error, panic before a response) or the lease was
// lost, it rolls the transaction back. So a process that dies after its
// writes but before its completion leaves neither, and the retry that
// takes the key over after the lease lapses is the only execution whose
// writes exist. Side effects outside the database (emails, calls to other
// services) are not covered. See README.md for the exact guarantee.
//
// # Uncertain records and tombstones
//
// Store is an [idem.Keeper]: [Store.AcquireKeep] stores the [idem.Keep]
// with the record (until_at, the end of its lease or retention, before
// expires_at, the end of the row), so that an in-progress row whose lease
// lapsed stays uncertain, never taken over, until [Store.Resolve] or its
// keep ends, and a completed row past its retention stays as a tombstone
// (fingerprint, no response). [Store.EnsureSchema] adds these columns to
// a table of an earlier version, whose rows read as records without a keep.
//
// # Recovery
//
// Store is an [idem.Recoverable]: the records due for recovery are found
// through the partial index on due_at (WHERE due_at IS NOT NULL), the time
// an in-progress row with a recovery payload is due: its lease's end plus
// the last claim's backoff. Every transition keeps due_at in the same
// statement (SetRecovery, Extend, Claim and takeovers set it; Complete,
// Suspend and Resolve clear it; Release, Evict and the purger delete the
// row), so the index holds the rows in flight with a payload and the due
// ones, never a completed one: [Store.Lapsed] is one range scan of it and
// [Store.Claim] one conditional UPDATE of one row, each costing what the
// due records cost, whatever the history (benchmarks/RESULTS.md).
//
// # Expired rows
//
// Reads ignore expired rows, and never return a tombstone's response;
// [Store.Purge] deletes expired rows and frees tombstones' responses, and
// [Store.StartPurger] runs it periodically until [Store.Close].
package pgstore
