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
// the records table, its primary key on the scoped key, and the index on
// expires_at that keeps [Store.Purge] to the expired rows.
//
//	key          text PRIMARY KEY  the engine's scoped key (64 hex characters)
//	state        smallint          1 in-progress, 2 completed
//	token        text              owner of the lease (kept once completed)
//	fingerprint  text              fingerprint of the request that created the record
//	response     bytea             the engine's encoding of the response (completed only)
//	expires_at   timestamptz       end of the lease, or of retention once completed
func (s *Store) SchemaSQL() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
  key         text PRIMARY KEY,
  state       smallint NOT NULL,
  token       text NOT NULL,
  fingerprint text NOT NULL,
  response    bytea,
  expires_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS ` + s.index + ` ON ` + s.table + ` (expires_at);`
}

// EnsureSchema creates the table and its index when they are missing
// (see [Store.SchemaSQL]), in one transaction under an advisory lock, so
// several instances starting together don't race. The schema of a
// qualified table name must exist. It is idempotent. Errors: ctx's error,
// server errors wrapped.
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
	if _, err := tx.Exec(ctx, s.SchemaSQL()); err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	return nil
}

// Purge deletes the expired rows (expires_at <= the server's clock), in
// batches of [PurgeBatch] through the expires_at index, and returns how
// many it deleted. Rows locked by a concurrent transition are left for the
// next purge. Reads ignore expired rows whether purged or not; purging only
// frees space. Errors: ctx's error, server errors wrapped (with the count
// deleted so far).
func (s *Store) Purge(ctx context.Context) (deleted int64, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		tag, err := s.pool.Exec(ctx, s.q.purge, PurgeBatch)
		if err != nil {
			return deleted, fmt.Errorf("pgstore: purge: %w", err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < PurgeBatch {
			return deleted, nil
		}
	}
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
		n, err := s.Purge(pctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			s.logger.Warn("pgstore: purge failed", "table", s.table, "error", err)
		case n > 0:
			s.logger.Debug("pgstore: purged expired records", "table", s.table, "deleted", n)
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
