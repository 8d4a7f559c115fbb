package pgstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	idem "github.com/idemkit/idem/core"
)

// PurgeBatch is how many expired rows one DELETE of [Store.Purge] removes;
// Purge repeats it until fewer are left, so no statement holds locks on a
// large table for long.
const PurgeBatch = 10000

// SchemaSQL returns the statements EnsureSchema runs, for a migration tool:
// the records table, its primary key on the scoped key, the index on
// expires_at that keeps [Store.Purge] to the expired rows, the columns of
// uncertain records and tombstones ([idem.Keep]; ALTER TABLE for a table
// created by an earlier version, whose rows read as records without a
// keep), the partial index on until_at through which Purge frees
// the responses of tombstones, and the partial index on due_at through
// which [Store.Lapsed] finds the records due for recovery.
//
//	key            text PRIMARY KEY  the engine's scoped key (64 hex characters)
//	state          smallint          1 in-progress, 2 completed
//	token          text              owner of the lease (kept once completed; '' in a tombstone)
//	fingerprint    text              fingerprint of the request that created the record
//	response       bytea             the engine's encoding of the response (completed only)
//	expires_at     timestamptz       end of the row: of the lease, or of retention once
//	                                 completed, plus the record's keep
//	until_at       timestamptz       end of the lease, or of retention once completed,
//	                                 when the record has a keep; NULL without (= expires_at)
//	keep_uncertain bigint            Keep.Uncertain in µs while in progress, else NULL
//	keep_tombstone bigint            Keep.Tombstone in µs while in progress, else NULL
//	steps          jsonb             the step journal ([idem.Journal]): [{"n": name, "t": token,
//	                                 "r": base64 result once done}, …] in start order; NULL for none
//	retain         bigint            how long (µs) an in-progress row with a journal or a recovery
//	                                 payload outlives its lease; NULL without either
//	recovery       bytea             the recovery payload ([idem.Recoverable]) while in progress
//	recovery_lease bigint            the lease (µs) a recovery claim takes ([Store.SetRecovery]); NULL
//	                                 for none (a payload stored by an earlier version)
//	attempts       integer           the recovery claims of the record ([Store.Claim]); NULL for none
//	backoff        bigint            the backoff (µs) the last claim gave; NULL for none
//	due_at         timestamptz       when an in-progress row with a payload is due for recovery
//	                                 (its lease end plus backoff); NULL otherwise
//
// An in-progress row past until_at is uncertain; a completed one past
// until_at is a tombstone (its response freed by the purge).
func (s *Store) SchemaSQL() string {
	return s.createSQL() + "\n" + s.alterSQL() + "\n" + s.untilIndexSQL() + "\n" + s.dueIndexSQL()
}

func (s *Store) createSQL() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
  key            text PRIMARY KEY,
  state          smallint NOT NULL,
  token          text NOT NULL,
  fingerprint    text NOT NULL,
  response       bytea,
  expires_at     timestamptz NOT NULL,
  until_at       timestamptz,
  keep_uncertain bigint,
  keep_tombstone bigint,
  steps          jsonb,
  retain         bigint,
  recovery       bytea,
  recovery_lease bigint,
  attempts       integer,
  backoff        bigint,
  due_at         timestamptz
);
CREATE INDEX IF NOT EXISTS ` + s.index + ` ON ` + s.table + ` (expires_at);`
}

// keepColumns are the columns added for [idem.Keep], [idem.Journal] and
// [idem.Recoverable] to a table created by an earlier version.
var keepColumns = []string{"until_at", "keep_uncertain", "keep_tombstone", "steps", "retain", "recovery", "recovery_lease", "attempts", "backoff", "due_at"}

func (s *Store) alterSQL() string {
	return `ALTER TABLE ` + s.table + ` ADD COLUMN IF NOT EXISTS until_at timestamptz,
  ADD COLUMN IF NOT EXISTS keep_uncertain bigint, ADD COLUMN IF NOT EXISTS keep_tombstone bigint,
  ADD COLUMN IF NOT EXISTS steps jsonb, ADD COLUMN IF NOT EXISTS retain bigint,
  ADD COLUMN IF NOT EXISTS recovery bytea, ADD COLUMN IF NOT EXISTS recovery_lease bigint,
  ADD COLUMN IF NOT EXISTS attempts integer,
  ADD COLUMN IF NOT EXISTS backoff bigint, ADD COLUMN IF NOT EXISTS due_at timestamptz;`
}

func (s *Store) dueIndexSQL() string {
	return `CREATE INDEX IF NOT EXISTS ` + s.dueIndex + ` ON ` + s.table + ` (due_at) WHERE due_at IS NOT NULL;`
}

func (s *Store) untilIndexSQL() string {
	return `CREATE INDEX IF NOT EXISTS ` + s.untilIndex + ` ON ` + s.table + ` (until_at)
  WHERE response IS NOT NULL AND until_at IS NOT NULL;`
}

// EnsureSchema creates the table and its indexes when they are missing, and
// adds the columns of [idem.Keep] to a table created by an earlier version
// (see [Store.SchemaSQL]), in one transaction under an advisory lock, so
// several instances starting together don't race. The ALTER TABLE, which
// takes an ACCESS EXCLUSIVE lock even when it has nothing to add, runs
// only when a column is missing; creating the until_at and due_at indexes
// on an upgraded table scans it once under a SHARE lock (writes wait; on a
// large table create it CONCURRENTLY first). The schema of a qualified
// table name must exist. It is idempotent. Errors: ctx's error, server
// errors wrapped.
func (s *Store) EnsureSchema(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	h := fnv.New64a()
	h.Write([]byte("idem pgstore schema " + s.table))
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(h.Sum64())); err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	if _, err := tx.Exec(ctx, s.createSQL()); err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	var have int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_attribute
WHERE attrelid = $1::regclass AND attname = ANY($2) AND NOT attisdropped`, s.table, keepColumns).Scan(&have); err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	if have < len(keepColumns) {
		if _, err := tx.Exec(ctx, s.alterSQL()); err != nil {
			return fmt.Errorf("pgstore: ensure schema: upgrade: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, s.untilIndexSQL()+"\n"+s.dueIndexSQL()); err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	return nil
}

// Purge deletes the expired rows (expires_at <= the server's clock), in
// batches of [PurgeBatch] through the expires_at index, then frees the
// response (and token) of every tombstone whose retention ended (until_at
// <= the server's clock; [idem.Keep.Tombstone]), in batches through the
// partial until_at index, and returns how many rows it deleted. Rows
// locked by a concurrent transition are left for the next purge. Reads
// ignore expired rows, and never return a tombstone's response, whether
// purged or not; purging only frees space (PostgreSQL reuses it after
// VACUUM, which autovacuum runs). Errors: ctx's error, server errors
// wrapped (with the count deleted so far).
func (s *Store) Purge(ctx context.Context) (deleted int64, err error) {
	deleted, _, err = s.purge(ctx)
	return deleted, err
}

// purge is Purge, also returning how many tombstones it freed.
func (s *Store) purge(ctx context.Context) (deleted, freed int64, err error) {
	for _, step := range []struct {
		sql string
		n   *int64
	}{{s.q.purge, &deleted}, {s.q.free, &freed}} {
		for {
			if err := ctx.Err(); err != nil {
				return deleted, freed, err
			}
			tag, err := s.pool.Exec(ctx, step.sql, PurgeBatch)
			if err != nil {
				return deleted, freed, fmt.Errorf("pgstore: purge: %w", err)
			}
			*step.n += tag.RowsAffected()
			if tag.RowsAffected() < PurgeBatch {
				break
			}
		}
	}
	return deleted, freed, nil
}

// StartPurger starts a goroutine that calls Purge every interval, each call
// bounded by the interval (at most one minute), logging failures at warning
// level; [Store.Close] stops it. Run it on one or more instances: purges
// are safe to overlap. Errors: [idem.ErrInvalidDuration] when interval <=
// 0, an error when a purger already runs or the store is closed.
func (s *Store) StartPurger(interval time.Duration) error {
	if interval <= 0 {
		return idem.ErrInvalidDuration
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errors.New("pgstore: StartPurger on a closed store")
	case s.stop != nil:
		return errors.New("pgstore: purger already started")
	}
	ctx, stop := context.WithCancel(context.Background())
	s.stop, s.stopped = stop, make(chan struct{})
	go s.purger(ctx, interval, s.stopped)
	return nil
}

func (s *Store) purger(ctx context.Context, interval time.Duration, stopped chan struct{}) {
	defer close(stopped)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, min(interval, time.Minute))
		n, freed, err := s.purge(pctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			s.logger.Warn("pgstore: purge failed", "table", s.table, "error", err)
		case n > 0 || freed > 0:
			s.logger.Debug("pgstore: purged expired records", "table", s.table, "deleted", n, "tombstones_freed", freed)
		}
	}
}

// Close stops the purger, if one runs, and waits for it; a purge in flight
// is cancelled. It never closes the borrowed pool, and the store stays
// usable except for StartPurger. It is safe to call more than once and
// always returns nil.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	stop, stopped := s.stop, s.stopped
	s.mu.Unlock()
	if stop != nil {
		stop()
		<-stopped
	}
	return nil
}
