package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
)

// PurgeBatch is how many expired rows one DELETE of [Store.Purge] removes;
// Purge repeats it until fewer are left, so no statement holds locks on a
// large table for long.
const PurgeBatch = 1000

// ProcSuffix ends the acquire procedure's name (the table's name + this
// suffix, in the table's database). The suffix carries the procedure's
// version, so that a version whose procedure takes other arguments creates
// a procedure of its own and leaves the earlier one to the instances still
// running it during a rolling deploy: v5 keeps the recovery payload of a
// lapsed record it takes over ([idem.Recoverable]) as it does its journal,
// and answers another fingerprint such a record unchanged; v4 keeps the
// step journal of a lapsed record it takes over ([idem.Journal]) and
// reports the previous holder; v3 took the record's keep ([idem.Keep]) and
// knew uncertain records and tombstones; v1 and v2 were named table +
// "_acquire".
const ProcSuffix = "_acquire_v5"

// procVersion is the acquire procedure's COMMENT: EnsureSchema replaces a
// procedure of this name whose comment differs (a body written by another
// build of the same version).
const procVersion = "idem mysqlstore acquire v5.1"

// keepColumns are the columns v3 and later added to the table, in order,
// with their definitions: EnsureSchema adds those missing from a table
// created by an earlier version (see [Store.UpgradeSQL]), and the due_at
// index with due_at.
var keepColumns = [...][2]string{
	{"ends_at", "DATETIME(6) NULL"},
	{"keep_uncertain", "BIGINT NULL"},
	{"keep_tombstone", "BIGINT NULL"},
	{"steps", "LONGTEXT NULL"},
	{"retain", "BIGINT NULL"},
	{"recovery", "LONGBLOB NULL"},
	{"attempts", "INT NULL"},
	{"backoff", "BIGINT NULL"},
	{"due_at", "DATETIME(6) NULL"},
	{"recovery_lease", "BIGINT NULL"},
}

// dueColumn is the column of keepColumns that comes with its index.
const dueColumn = "due_at"

// dueIndex returns the clause adding the due_at index, through which
// [Store.Lapsed] reads the records due for recovery.
func (s *Store) dueIndex() string {
	return "ADD KEY " + quote(s.names.table+"_due_at") + " (due_at)"
}

// SchemaSQL returns the statements EnsureSchema runs, one per string (the
// procedure's body holds semicolons, so they cannot be split on them), for
// a migration tool: the records table with its primary key on the scoped
// key and the index on expires_at that keeps [Store.Purge] to the rows
// due, then the acquire procedure (dropped and created again, so running
// them again upgrades it). A table created by an earlier version also
// needs [Store.UpgradeSQL], once.
//
//	key             VARBINARY(255) PRIMARY KEY  the engine's scoped key (64 hex characters)
//	state           TINYINT                     1 in-progress, 2 completed, 4 tombstone
//	token           VARBINARY(255)              owner of the lease (kept once completed; '' in a tombstone)
//	fingerprint     VARBINARY(255)              fingerprint of the request that created the record
//	response        LONGBLOB                    the engine's response bytes (completed only)
//	expires_at      DATETIME(6)                 when the purger acts on the row, in UTC: the end of
//	                                            the lease (plus keep_uncertain), of retention, or
//	                                            of a tombstone
//	ends_at         DATETIME(6) NULL            the lease's end, only under keep_uncertain
//	keep_uncertain  BIGINT NULL                 [idem.Keep.Uncertain] in µs, NULL for none (in progress only)
//	keep_tombstone  BIGINT NULL                 [idem.Keep.Tombstone] in µs, NULL for none
//	steps           LONGTEXT NULL               the step journal ([idem.Journal]), a JSON object
//	                                            {name: {"i": start order, "t": token, "r": base64
//	                                            result once done}}; NULL for none
//	retain          BIGINT NULL                 how long (µs) an in-progress row with a journal or a
//	                                            recovery payload outlives its lease (ends_at is then
//	                                            set); NULL for none
//	recovery        LONGBLOB NULL               the recovery payload ([idem.Recoverable]), in progress only
//	attempts        INT NULL                    the recovery claims of the record ([Store.Claim])
//	backoff         BIGINT NULL                 the backoff (µs) the last claim gave
//	due_at          DATETIME(6) NULL            when an in-progress row with a payload is due for
//	                                            recovery (its lease's end plus backoff), indexed;
//	                                            NULL otherwise
//	recovery_lease  BIGINT NULL                 the lease (µs) a recovery claim takes ([Store.SetRecovery]);
//	                                            NULL for none (a payload stored by an earlier version)
//
// A record acquired with the zero Keep leaves the three last columns NULL
// (no bytes but the row's NULL bitmap), as rows written before they
// existed read. Under a keep, an in-progress row whose lease (ends_at)
// lapsed is uncertain until expires_at; a completed row past expires_at
// (its response's end) under keep_tombstone is a tombstone until
// keep_tombstone later, and the purger (or the next acquire of the key)
// turns it into one: state 4, response and token dropped, expires_at the
// tombstone's end.
//
// The acquire procedure is one round trip: it answers a live record
// (replay, conflict, mismatch, uncertain, tombstone) from a plain read,
// first freeing the response of a tombstone still holding one; otherwise
// it inserts the record or takes a gone one over with INSERT … ON DUPLICATE
// KEY UPDATE, whose assignments all test the takeover condition (gone, or
// this token's own in-progress record) on the row it locked, expires_at
// last so the condition holds while the others are assigned; then it
// returns the live row with the state shown for it, whoever won, or this
// token's own row even if its lease (however short) lapsed meanwhile. Each
// statement in it is its own transaction (autocommit), so the final read
// sees the latest commit at either isolation level.
func (s *Store) SchemaSQL() []string {
	t := s.table
	gone := `NOT ` + live
	// held: a lapsed row kept for its journal or recovery payload, taken
	// over by a request of its fingerprint (resuming it), or by any when it
	// has neither (a payload counts as a started step: its recoverer
	// finishes the request).
	held := `(state = 1 AND keep_uncertain IS NULL AND ends_at <= ` + now + ` AND (fingerprint = p_fp OR (steps IS NULL AND recovery IS NULL)))`
	cond := `(` + gone + ` OR (state = 1 AND token = p_token) OR ` + held + `)`
	// resumes, read before the assignments below change the row: the
	// journal of a row still kept, with this fingerprint, goes on.
	resumes := `(state = 1 AND expires_at > ` + now + ` AND fingerprint = p_fp AND (steps IS NOT NULL OR recovery IS NOT NULL))`
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + t + ` (
  ` + "`key`" + `         VARBINARY(255) NOT NULL,
  state          TINYINT NOT NULL,
  token          VARBINARY(255) NOT NULL,
  fingerprint    VARBINARY(255) NOT NULL,
  response       LONGBLOB NULL,
  expires_at     DATETIME(6) NOT NULL,
  ends_at        DATETIME(6) NULL,
  keep_uncertain BIGINT NULL,
  keep_tombstone BIGINT NULL,
  PRIMARY KEY (` + "`key`" + `),
  KEY ` + quote(s.names.table+"_expires_at") + ` (expires_at)
) ENGINE=InnoDB`,
		`DROP PROCEDURE IF EXISTS ` + s.proc,
		`CREATE PROCEDURE ` + s.proc + `(IN p_key VARBINARY(255), IN p_token VARBINARY(255), IN p_fp VARBINARY(255), IN p_lease BIGINT,
  IN p_uncertain BIGINT, IN p_tombstone BIGINT)
  MODIFIES SQL DATA
  COMMENT '` + procVersion + `'
BEGIN
  DECLARE v_seen TINYINT;
  DECLARE v_prev VARBINARY(255) DEFAULT '';
  DECLARE v_left BIGINT DEFAULT 0;
  SET v_seen = (SELECT ` + tombstoneDue + ` FROM ` + t + " WHERE `key` = p_key AND " + live + ` AND NOT (state = 1 AND token = p_token) AND NOT ` + held + `);
  IF v_seen IS NULL THEN
    SELECT token, TIMESTAMPDIFF(MICROSECOND, ` + now + `, IFNULL(ends_at, expires_at)) INTO v_prev, v_left FROM ` + t +
			" WHERE `key` = p_key AND state = 1 AND token <> p_token AND IFNULL(ends_at, expires_at) <= " + now + `;
    INSERT INTO ` + t + " (`key`, state, token, fingerprint, response, expires_at, ends_at, keep_uncertain, keep_tombstone)" + `
    VALUES (p_key, 1, p_token, p_fp, NULL, ` + now + ` + INTERVAL (p_lease + p_uncertain) MICROSECOND,
      IF(p_uncertain > 0, ` + now + ` + INTERVAL p_lease MICROSECOND, NULL), NULLIF(p_uncertain, 0), NULLIF(p_tombstone, 0))
    ON DUPLICATE KEY UPDATE
      due_at = IF(` + cond + `, IF(` + resumes + ` AND recovery IS NOT NULL AND p_uncertain = 0,
        ` + now + ` + INTERVAL (p_lease + IFNULL(backoff, 0)) MICROSECOND, NULL), due_at),
      attempts = IF(` + cond + `, IF(` + resumes + `, attempts, NULL), attempts),
      backoff = IF(` + cond + `, IF(` + resumes + `, backoff, NULL), backoff),
      recovery = IF(` + cond + `, IF(` + resumes + `, recovery, NULL), recovery),
      retain = IF(` + cond + `, IF(` + resumes + `, retain, NULL), retain),
      steps = IF(` + cond + `, IF(` + resumes + `, steps, NULL), steps),
      fingerprint = IF(` + cond + `, p_fp, fingerprint),
      response = IF(` + cond + `, NULL, response),
      state = IF(` + cond + `, 1, state),
      token = IF(` + cond + `, p_token, token),
      ends_at = IF(` + cond + `, IF(p_uncertain > 0 OR retain IS NOT NULL, ` + now + ` + INTERVAL p_lease MICROSECOND, NULL), ends_at),
      keep_uncertain = IF(` + cond + `, NULLIF(p_uncertain, 0), keep_uncertain),
      keep_tombstone = IF(` + cond + `, NULLIF(p_tombstone, 0), keep_tombstone),
      expires_at = IF(` + cond + `, ` + now + ` + INTERVAL (p_lease + IF(p_uncertain > 0, p_uncertain, IFNULL(retain, 0))) MICROSECOND, expires_at);
  ELSEIF v_seen THEN
    UPDATE ` + t + " " + freeTombstone + " WHERE `key` = p_key AND " + tombstoneDue + `;
  END IF;
  SELECT ` + shown + `, token, fingerprint, response, TIMESTAMPDIFF(MICROSECOND, ` + now + `, ` + ttlAt + `) AS left_us,
    v_prev AS prev_token, v_left AS prev_left_us
    FROM ` + t + " WHERE `key` = p_key AND (" + live + ` OR (state = 1 AND token = p_token));
END`,
	}
}

// UpgradeSQL returns the statement that adds to a table created by an
// earlier version of this package the columns of [idem.Keep] (see
// [Store.SchemaSQL]), for a migration tool: run it once, then SchemaSQL
// (MySQL has no ADD COLUMN IF NOT EXISTS; EnsureSchema adds only the
// missing ones). Adding NULL columns at the end is instant on MySQL 8.0.12+
// and MariaDB 10.3+: rows are not rewritten, and read as records without a
// keep.
func (s *Store) UpgradeSQL() []string {
	q := `ALTER TABLE ` + s.table
	for i, c := range keepColumns {
		if i > 0 {
			q += ","
		}
		q += " ADD COLUMN " + c[0] + " " + c[1]
	}
	return []string{q + ", " + s.dueIndex()}
}

// EnsureSchema creates the table and its index when they are missing, adds
// the columns an earlier version's table lacks (see [Store.UpgradeSQL]),
// and creates the acquire procedure when it is missing or another version
// (see [Store.SchemaSQL]), under the named lock GET_LOCK('idem mysqlstore
// schema <table>'), so several instances starting together don't race.
// It needs the CREATE and CREATE ROUTINE privileges (ALTER and ALTER
// ROUTINE to upgrade). It is idempotent. Errors: ctx's error, server
// errors wrapped.
//
// Upgrading from an earlier version adds the columns and this version's
// procedure beside the earlier one (table + "_acquire"), which instances
// still running that version keep calling during a rolling deploy; drop
// it once every instance runs this version.
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
	if err := s.addKeepColumns(ctx, conn); err != nil {
		return fmt.Errorf("mysqlstore: ensure schema: %w", err)
	}
	schema := s.names.schema
	var comment string
	err = conn.QueryRowContext(ctx, `SELECT ROUTINE_COMMENT FROM information_schema.ROUTINES
WHERE ROUTINE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND ROUTINE_NAME = ? AND ROUTINE_TYPE = 'PROCEDURE'`,
		schema, s.names.table+ProcSuffix).Scan(&comment)
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

// addKeepColumns adds the columns of keepColumns the table lacks (a table
// created before they existed), in one ALTER TABLE.
func (s *Store) addKeepColumns(ctx context.Context, conn *sql.Conn) error {
	rows, err := conn.QueryContext(ctx, `SELECT COLUMN_NAME FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?`, s.names.schema, s.names.table)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			_ = rows.Close()
			return err
		}
		have[strings.ToLower(c)] = true
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var add []string
	for _, c := range keepColumns {
		if !have[c[0]] {
			add = append(add, "ADD COLUMN "+c[0]+" "+c[1])
			if c[0] == dueColumn {
				add = append(add, s.dueIndex())
			}
		}
	}
	if len(add) == 0 {
		return nil
	}
	_, err = conn.ExecContext(ctx, `ALTER TABLE `+s.table+` `+strings.Join(add, ", "))
	return err
}

// Purge deletes the expired rows (expires_at <= the server's clock) and
// frees the responses of tombstones ([idem.Keep.Tombstone]) whose
// retention ended, and returns how many rows it deleted: it reads up to
// [PurgeBatch] due keys through the expires_at index, turns the completed
// rows kept as tombstones among them into tombstones (response and token
// dropped, expires_at moved to the tombstone's end, when it deletes them),
// deletes the others by primary key (still only if due: a row taken over
// meanwhile stays), and repeats while batches are full or it freed
// tombstones (one whose keep ended too is then deleted). Reads ignore
// expired rows, and tombstones' responses, whether purged or not; purging
// only frees space. Errors: ctx's error, server errors wrapped (with the
// count deleted so far).
func (s *Store) Purge(ctx context.Context) (deleted int64, err error) {
	deleted, _, err = s.purge(ctx)
	return deleted, err
}

// purge is Purge, also counting the tombstones whose response it freed.
func (s *Store) purge(ctx context.Context) (deleted, freed int64, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return deleted, freed, err
		}
		keys, tombstones, err := s.dueKeys(ctx)
		if err != nil {
			return deleted, freed, fmt.Errorf("mysqlstore: purge: %w", err)
		}
		if len(keys)+len(tombstones) == 0 {
			return deleted, freed, nil
		}
		full := len(keys)+len(tombstones) == PurgeBatch
		nf, err := s.purgeBatch(ctx, s.q.purgeFree, tombstones)
		freed += nf
		if err != nil {
			return deleted, freed, fmt.Errorf("mysqlstore: purge: %w", err)
		}
		n, err := s.purgeBatch(ctx, s.q.purgeDelete, keys)
		deleted += n
		if err != nil {
			return deleted, freed, fmt.Errorf("mysqlstore: purge: %w", err)
		}
		// A tombstone just freed whose keep has ended too is due now:
		// the next batch deletes it.
		if !full && nf == 0 {
			return deleted, freed, nil
		}
	}
}

// purgeBatch runs query, a statement of PurgeBatch keys, on keys (none: no
// statement), and returns the rows it affected.
func (s *Store) purgeBatch(ctx context.Context, query string, keys []any) (int64, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	st, err := s.stmt(ctx, query)
	if err != nil {
		return 0, err
	}
	keys = append(keys, make([]any, PurgeBatch-len(keys))...) // NULL matches no key
	res, err := st.ExecContext(ctx, keys...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// dueKeys returns up to PurgeBatch due keys: those to delete, and the
// tombstones whose response to free.
func (s *Store) dueKeys(ctx context.Context) (keys, tombstones []any, err error) {
	rows, err := s.db.QueryContext(ctx, s.q.purgeSelect, PurgeBatch)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			k    []byte
			free bool
		)
		if err := rows.Scan(&k, &free); err != nil {
			return nil, nil, err
		}
		if free {
			tombstones = append(tombstones, k)
		} else {
			keys = append(keys, k)
		}
	}
	return keys, tombstones, rows.Err()
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
		n, freed, err := s.purge(pctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			s.logger.Warn("mysqlstore: purge failed", "table", s.table, "error", err)
		case n > 0 || freed > 0:
			s.logger.Debug("mysqlstore: purged expired records", "table", s.table, "deleted", n, "tombstones", freed)
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
