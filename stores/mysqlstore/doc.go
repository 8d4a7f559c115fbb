// Package mysqlstore is an [idem.Store] on MySQL 8 or MariaDB (tested on 10.11)
// (InnoDB) through database/sql and github.com/go-sql-driver/mysql,
// shared by every instance of a service, with transactional completion: a
// handler's writes to the same database commit in one transaction with
// its completed record, or not at all.
//
// # Layout
//
// One table (default "idem_records", see [WithTable]) with one row per
// record, primary key on the engine's scoped key, an index on expires_at
// for [Store.Purge], and a stored procedure (table + [ProcSuffix]) for the
// acquire. Create them with [Store.EnsureSchema] at startup, or run
// [Store.SchemaSQL] in a migration. Servers without stored procedures
// (TiDB, some proxies) are not supported.
//
// # Atomicity, time and round trips
//
// Every transition is one round trip: acquire is one CALL of the
// procedure, which answers a live record (replay, 409, 422) from a plain
// read, and otherwise inserts the record or takes one whose lease lapsed
// over with INSERT … ON DUPLICATE KEY UPDATE, returning the winner's row;
// complete, release and extend are UPDATE or DELETE statements by primary
// key, conditional on the token, the in-progress state and a live lease.
// Statements are prepared once per connection, so none costs an extra
// round trip whatever the DSN's interpolateParams. Leases and retention
// are counted by the server's clock (UTC_TIMESTAMP(6), microseconds,
// independent of the session time_zone), never the instance's. A first
// execution costs 2 round trips (acquire, complete); a replay, a 409
// conflict or a 422 mismatch 1.
//
// # Isolation and locking
//
// The store needs no particular isolation level, and works the same at
// REPEATABLE READ (the default of MySQL and MariaDB) and READ COMMITTED.
// Each statement runs in autocommit (so each of the procedure's statements
// too; sessions must keep autocommit on, the default), and every decision that matters is made by a current read under
// a row lock, never by a snapshot: the takeover condition of INSERT … ON
// DUPLICATE KEY UPDATE is evaluated on the latest version of the row,
// under its exclusive lock, so among racing takeovers exactly one wins
// (the storetest case RacingTakeoverOneWinner, run at both levels, is the
// proof), and the completion UPDATE sees a takeover that committed after
// its transaction began, even at REPEATABLE READ. No statement locks a
// range: every write is by primary key (an absent key takes at most a
// short gap lock at REPEATABLE READ), and Purge finds expired keys with a
// plain read of the expires_at index before it deletes them by primary
// key, so purging takes no gap locks on that index. InnoDB may still pick
// an acquire as a deadlock victim (rolled back whole); acquire then runs
// again, up to 5 times. No SELECT … FOR UPDATE is used.
//
// # Transactional completion
//
// A handler calls [Tx] with its request context to get the execution's
// *sql.Tx (begun on first use, at the server's default isolation level)
// and writes through it, directly or through sqlx or GORM (see README.md).
// The engine runs the completion UPDATE, conditional on the execution
// still holding its lease, in that transaction and commits it; when the
// response is not stored (5xx, handler error, panic before a response) or
// the lease was lost, it rolls the transaction back. So a process that
// dies after its writes but before its completion leaves neither, and the
// retry that takes the key over after the lease lapses is the only
// execution whose writes exist. Side effects outside the database are not
// covered.
//
// # MySQL and MariaDB
//
// The SQL is common to both. Differences it relies on or avoids: the
// session isolation variable is transaction_isolation on MySQL and
// tx_isolation on MariaDB before 11.1 (set it in the DSN, quoted, e.g.
// transaction_isolation=%27READ-COMMITTED%27); MySQL's default
// max_allowed_packet is 64 MiB and MariaDB's 16 MiB (a larger response
// is [ErrTooLarge]); ON DUPLICATE KEY UPDATE uses the procedure's
// parameters rather than VALUES() (deprecated on MySQL 8) or a row alias
// (absent on MariaDB); UTC_TIMESTAMP(6) is the statement's start time on
// both, not the transaction's. At READ COMMITTED, MySQL needs row-based
// binary logging (binlog_format=ROW, its default).
//
// # Uncertain records and tombstones
//
// The store is an [idem.Keeper]: [Store.AcquireKeep] stores the record's
// [idem.Keep] in its row, which carries it through Extend, Complete and
// the transactional completion; [Store.Acquire] is AcquireKeep with the
// zero Keep, whose rows leave the keep columns NULL (the same row size as
// before they existed). An in-progress row whose lease lapsed under
// Keep.Uncertain is uncertain until the keep ends: never taken over, still
// owned by its token, resolved by [Store.Resolve]. A completed row whose
// retention ended under Keep.Tombstone is a tombstone (fingerprint only)
// until the keep ends: its response is never returned again, and is freed
// by the purger or the next acquire of the key. README.md has the layout
// and the measured cost (a tombstone: about 205 bytes of data and 100 of
// index, against 521 and 100 for a completed record with a 200-byte body).
//
// # Recovery
//
// Store is an [idem.Recoverable]: the records due for recovery are found
// through the index on due_at, the time an in-progress row with a
// recovery payload is due (its lease's end plus the last claim's
// backoff; NULL otherwise). Every transition keeps due_at in the same
// statement (SetRecovery, Extend, Claim and takeovers set it; Complete and
// Suspend clear it; Release, Evict and the purger delete the row), so the
// index range a [Store.Lapsed] reads holds the due rows (and rows gone but
// not yet purged), never a completed one; [Store.Claim] is a SELECT of the
// row by its key and a conditional UPDATE (2 round trips, 1 when it is not
// due). Both cost what the due records cost, whatever the history
// (benchmarks/RESULTS.md).
//
// # Expired rows
//
// Reads ignore expired rows; [Store.Purge] deletes them (and frees
// tombstones' responses), and [Store.StartPurger] runs it periodically
// until [Store.Close].
package mysqlstore
