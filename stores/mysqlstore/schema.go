package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	idem "github.com/idemkit/idem/core"
)

// PurgeBatch is how many expired rows one DELETE of [Store.Purge] removes;
// Purge repeats it until fewer are left, so no statement holds locks on a
// large table for long.
const PurgeBatch = 1000

// procVersion is the acquire procedure's COMMENT: EnsureSchema replaces a
// procedure whose comment differs (one written by another version).
const procVersion = "idem mysqlstore acquire v2"

// SchemaSQL returns the statements EnsureSchema runs, one per string (the
// procedure's body holds semicolons, so they cannot be split on them), for
// a migration tool: the records table with its primary key on the scoped
// key and the index on expires_at that keeps [Store.Purge] to the expired
// rows, then the acquire procedure (dropped and created again, so running
// them again upgrades it).
//
//	key          VARBINARY(255) PRIMARY KEY  the engine's scoped key (64 hex characters)
//	state        TINYINT                     1 in-progress, 2 completed
//	token        VARBINARY(255)              owner of the lease (kept once completed)
//	fingerprint  VARBINARY(255)              fingerprint of the request that created the record
//	response     LONGBLOB                    the engine's response bytes (completed only)
//	expires_at   DATETIME(6)                 end of the lease, or of retention once completed, in UTC
//
// The acquire procedure is one round trip: it answers a live record
// (replay, conflict, mismatch) from a plain read; otherwise it inserts the
// record or takes an expired one over with INSERT … ON DUPLICATE KEY
// UPDATE, whose assignments all test the takeover condition (expired, or
// this token's own in-progress record) on the row it locked, expires_at
// last so the condition holds while the others are assigned; then it
// returns the live row, whoever won, or this token's own row even if its
// lease (however short) lapsed meanwhile. Each statement in it is its own
// transaction (autocommit), so the final read sees the latest commit at
// either isolation level.
func (s *Store) SchemaSQL() []string {
	t := s.table
	cond := `(expires_at <= UTC_TIMESTAMP(6) OR (state = 1 AND token = p_token))`
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + t + ` (
  ` + "`key`" + `      VARBINARY(255) NOT NULL,
  state       TINYINT NOT NULL,
  token       VARBINARY(255) NOT NULL,
  fingerprint VARBINARY(255) NOT NULL,
  response    LONGBLOB NULL,
  expires_at  DATETIME(6) NOT NULL,
  PRIMARY KEY (` + "`key`" + `),
  KEY ` + quote(s.names.table+"_expires_at") + ` (expires_at)
) ENGINE=InnoDB`,
		`DROP PROCEDURE IF EXISTS ` + s.proc,
		`CREATE PROCEDURE ` + s.proc + `(IN p_key VARBINARY(255), IN p_token VARBINARY(255), IN p_fp VARBINARY(255), IN p_lease BIGINT)
  MODIFIES SQL DATA
  COMMENT '` + procVersion + `'
BEGIN
  IF NOT EXISTS (SELECT 1 FROM ` + t + " WHERE `key` = p_key AND " + live + ` AND NOT (state = 1 AND token = p_token)) THEN
    INSERT INTO ` + t + " (`key`, state, token, fingerprint, response, expires_at)" + `
    VALUES (p_key, 1, p_token, p_fp, NULL, UTC_TIMESTAMP(6) + INTERVAL p_lease MICROSECOND)
    ON DUPLICATE KEY UPDATE
      fingerprint = IF(` + cond + `, p_fp, fingerprint),
      response = IF(` + cond + `, NULL, response),
      state = IF(` + cond + `, 1, state),
      token = IF(` + cond + `, p_token, token),
      expires_at = IF(` + cond + `, UTC_TIMESTAMP(6) + INTERVAL p_lease MICROSECOND, expires_at);
  END IF;
  SELECT state, token, fingerprint, response, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) AS left_us
    FROM ` + t + " WHERE `key` = p_key AND (" + live + ` OR (state = 1 AND token = p_token));
END`,
	}
}

// EnsureSchema creates the table and its index when they are missing, and
// the acquire procedure when it is missing or another version (see
// [Store.SchemaSQL]), under the named lock GET_LOCK('idem mysqlstore
// schema <table>'), so several instances starting together don't race.
// It needs the CREATE and CREATE ROUTINE privileges (ALTER ROUTINE to
// upgrade). It is idempotent. Errors: ctx's error, server errors wrapped.
func (s *Store) EnsureSchema(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("mysqlstore: ensure schema: %w", err)
	}
	defer conn.Close()
	lock := "idem mysqlstore schema " + s.table
	if len(lock) > 64 { // MySQL's limit on lock names
		lock = lock[:64]
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 30)`, lock).Scan(&got); err != nil {
		return fmt.Errorf("mysqlstore: ensure schema: %w", err)
	}
	if got.Int64 != 1 {
		return errors.New("mysqlstore: ensure schema: another instance held the schema lock for 30s")
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(?)`, lock) }()
	stmts := s.SchemaSQL()
	if _, err := conn.ExecContext(ctx, stmts[0]); err != nil {
		return fmt.Errorf("mysqlstore: ensure schema: %w", err)
	}
	schema := s.names.schema
	var comment string
	err = conn.QueryRowContext(ctx, `SELECT ROUTINE_COMMENT FROM information_schema.ROUTINES
WHERE ROUTINE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND ROUTINE_NAME = ? AND ROUTINE_TYPE = 'PROCEDURE'`,
		schema, s.names.table+"_acquire").Scan(&comment)
	switch {
	case err == nil && comment == procVersion:
		return nil
	case err != nil && !errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("mysqlstore: ensure schema: %w", err)
	}
	for _, q := range stmts[1:] {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("mysqlstore: ensure schema: %w", err)
		}
	}
	return nil
}

// Purge deletes the expired rows (expires_at <= the server's clock) and
// returns how many it deleted: it reads up to [PurgeBatch] expired keys
// through the expires_at index, deletes them by primary key (still only if
// expired: a row taken over meanwhile stays), and repeats while batches
// are full. Reads ignore expired rows whether purged or not; purging only
// frees space. Errors: ctx's error, server errors wrapped (with the count
// deleted so far).
func (s *Store) Purge(ctx context.Context) (deleted int64, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		keys, err := s.expiredKeys(ctx)
		if err != nil {
			return deleted, fmt.Errorf("mysqlstore: purge: %w", err)
		}
		if len(keys) == 0 {
			return deleted, nil
		}
		st, err := s.stmt(ctx, s.q.purgeDelete)
		if err != nil {
			return deleted, fmt.Errorf("mysqlstore: purge: %w", err)
		}
		full := len(keys) == PurgeBatch
		keys = append(keys, make([]any, PurgeBatch-len(keys))...) // NULL matches no key
		res, err := st.ExecContext(ctx, keys...)
		if err != nil {
			return deleted, fmt.Errorf("mysqlstore: purge: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return deleted, fmt.Errorf("mysqlstore: purge: %w", err)
		}
		deleted += n
		if !full {
			return deleted, nil
		}
	}
}

func (s *Store) expiredKeys(ctx context.Context) ([]any, error) {
	rows, err := s.db.QueryContext(ctx, s.q.purgeSelect, PurgeBatch)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []any
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
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
		return errors.New("mysqlstore: StartPurger on a closed store")
	case s.stop != nil:
		return errors.New("mysqlstore: purger already started")
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
			s.logger.Warn("mysqlstore: purge failed", "table", s.table, "error", err)
		case n > 0:
			s.logger.Debug("mysqlstore: purged expired records", "table", s.table, "deleted", n)
		}
	}
}

// Close stops the purger, if one runs, and waits for it (a purge in flight
// is cancelled), then closes the store's prepared statements. It never
// closes the borrowed *sql.DB. The store stays usable except for
// StartPurger: later calls prepare their statements again. Close it after
// the engine, so no call is in flight. It is safe to call more than once
// and always returns nil.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	stop, stopped := s.stop, s.stopped
	s.mu.Unlock()
	if stop != nil {
		stop()
		<-stopped
	}
	s.stmtMu.Lock()
	for q, st := range s.stmts {
		_ = st.Close()
		delete(s.stmts, q)
	}
	s.stmtMu.Unlock()
	return nil
}
