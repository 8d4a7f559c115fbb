package mysqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
)

var (
	_ idem.Recoverable  = (*Store)(nil)
	_ idem.StepResolver = (*Store)(nil)
)

// SQL fragments of recovery, on a row by the server's clock.
const (
	// due: in progress, with a payload, no Keep.Uncertain (such a row
	// turns uncertain when its lease lapses), not gone, its lease (ends_at)
	// lapsed at least the last claim's backoff ago.
	due = `(state = 1 AND recovery IS NOT NULL AND keep_uncertain IS NULL AND expires_at > ` + now +
		` AND ends_at + INTERVAL IFNULL(backoff, 0) MICROSECOND <= ` + now + `)`
	// settled: an in-progress row kept past its lease (uncertain, or
	// lapsed with a journal), whose step at path ? is started, not done.
	settled = `state = 1 AND expires_at > ` + now + ` AND ends_at <= ` + now +
		` AND JSON_CONTAINS_PATH(IFNULL(steps, '{}'), 'one', ?) AND NOT JSON_CONTAINS_PATH(IFNULL(steps, '{}'), 'one', CONCAT(?, '.r'))`
	// resumable: the columns of a row whose step was resolved, assigned
	// left to right: kept for its retain from now when it was uncertain
	// (expires_at first, while keep_uncertain tells), then in progress
	// with its lease lapsed, its recovery attempts and backoff none again,
	// due for recovery at once when it has a payload.
	resumable = `expires_at = IF(keep_uncertain IS NOT NULL, ` + now + ` + INTERVAL IFNULL(retain, 0) MICROSECOND, expires_at),
  keep_uncertain = NULL, attempts = NULL, backoff = NULL, due_at = IF(recovery IS NULL, NULL, ends_at)`
)

// addRecovery sets the statements of [idem.Recoverable] and
// [idem.StepResolver] on table t.
func (q *queries) addRecovery(t string) {
	leased := "`key` = ? AND token = ? AND state = 1 AND IFNULL(ends_at, expires_at) > " + now
	// setRecovery is startStep's conditional UPDATE of the token's leased
	// row, storing the payload instead of a step and placing the row in
	// the due_at index at its lease's end (plus the last claim's backoff),
	// assigned left to right. Twice: the same values again (0 rows
	// affected without clientFoundRows: leasedBy then tells).
	q.setRecovery = `UPDATE ` + t + ` SET ends_at = IFNULL(ends_at, expires_at), retain = GREATEST(IFNULL(retain, 0), ?),
  expires_at = IF(keep_uncertain IS NOT NULL, expires_at, ends_at + INTERVAL retain MICROSECOND), recovery = ?, recovery_lease = ?,
  due_at = IF(keep_uncertain IS NULL, ends_at + INTERVAL IFNULL(backoff, 0) MICROSECOND, NULL)
WHERE ` + leased
	q.leasedBy = `SELECT EXISTS (SELECT 1 FROM ` + t + ` WHERE ` + leased + `)`
	// lapsed is a range scan of the due_at index, soonest due first. Every
	// transition keeps due_at exact (SetRecovery, Extend, Claim, takeover
	// set it; Complete, Suspend clear it; Release, Evict, purge delete the
	// row), so the range holds due rows, and rows gone but not purged; due
	// re-checks each. A read: safe twice.
	q.lapsed = "SELECT `key`, IFNULL(attempts, 0) FROM " + t + ` WHERE due_at <= ` + now + ` AND ` + due + ` ORDER BY due_at LIMIT ?`
	// claimRead reads what Claim returns, and whether the row is due (no
	// lock); claim then takes it over with a conditional UPDATE, as the
	// acquire procedure's takeover does (journal, payload, retain kept),
	// for the lease kept with the payload (the lease given for a payload
	// stored without one),
	// only if it is still due under the token and attempts read: every
	// write that could change what was read (another claim, a takeover,
	// ResolveStep, Evict) changes the token, the attempts, or the row.
	q.claimRead = "SELECT token, fingerprint, recovery, IFNULL(attempts, 0), TIMESTAMPDIFF(MICROSECOND, ends_at, " + now + "), " + due +
		" FROM " + t + " WHERE `key` = ?"
	q.claim = `UPDATE ` + t + ` SET token = ?, attempts = IFNULL(attempts, 0) + 1, backoff = ?,
  ends_at = ` + now + ` + INTERVAL IFNULL(recovery_lease, ?) MICROSECOND, expires_at = ends_at + INTERVAL IFNULL(retain, 0) MICROSECOND,
  due_at = ends_at + INTERVAL backoff MICROSECOND WHERE ` + "`key` = ? AND token = ? AND IFNULL(attempts, 0) = ? AND " + due
	// resolveStepDone marks the step at path (the first parameter) of an
	// uncertain or lapsed row done. resolveStepRead locks such a row and
	// reads its journal; resolveStepUndone then writes the journal without
	// the step (NULL when empty), in the same transaction. Twice: the step
	// is then done or absent, so the second changes nothing.
	q.resolveStepDone = `UPDATE ` + t + ` SET steps = JSON_SET(steps, CONCAT(?, '.r'), TO_BASE64(?)), ` + resumable +
		" WHERE `key` = ? AND " + settled
	q.resolveStepRead = `SELECT steps FROM ` + t + " WHERE `key` = ? AND " + settled + ` FOR UPDATE`
	q.resolveStepUndone = `UPDATE ` + t + ` SET steps = ?, ` + resumable + " WHERE `key` = ?"
}

// SetRecovery implements [idem.Recoverable]: one conditional UPDATE of the
// token's leased row; when it reports no row changed, a SELECT tells a
// repeated call (nil) from a lost lease.
func (s *Store) SetRecovery(ctx context.Context, key, token string, payload []byte, retain, lease time.Duration) error {
	switch {
	case retain <= 0 || lease <= 0:
		return idem.ErrInvalidDuration
	case len(payload) > idem.MaxRecoveryBytes:
		return fmt.Errorf("mysqlstore: recovery payload of %d bytes: %w", len(payload), idem.ErrTooLarge)
	case len(payload) == 0:
		return errors.New("mysqlstore: empty recovery payload")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkIDs(key, token); err != nil {
		return err
	}
	res, err := s.exec(ctx, s.q.setRecovery, micros(retain), payload, micros(lease), key, token)
	if err != nil {
		return fmt.Errorf("mysqlstore: set recovery: %w", err)
	}
	if ownedRow(res, "set recovery") == nil {
		return nil
	}
	var leased bool
	if err := s.queryRow(ctx, s.q.leasedBy, key, token).Scan(&leased); err != nil {
		return fmt.Errorf("mysqlstore: set recovery: %w", err)
	}
	if !leased {
		return idem.ErrNotOwner
	}
	return nil
}

// exec runs query, prepared, with args.
func (s *Store) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// queryRow runs query, prepared, with args; a failed preparation is the
// row's error.
func (s *Store) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return s.db.QueryRowContext(ctx, query, args...) // reports err again, or runs unprepared
	}
	return st.QueryRowContext(ctx, args...)
}

// Lapsed implements [idem.Recoverable]: one SELECT, a range scan of the
// due_at index, soonest due first.
func (s *Store) Lapsed(ctx context.Context, limit int) ([]idem.LapsedRecord, error) {
	if limit <= 0 {
		return nil, errors.New("mysqlstore: lapsed: limit must be > 0")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st, err := s.stmt(ctx, s.q.lapsed)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: lapsed: %w", err)
	}
	rows, err := st.QueryContext(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: lapsed: %w", err)
	}
	defer rows.Close()
	var recs []idem.LapsedRecord
	for rows.Next() {
		var r idem.LapsedRecord
		if err := rows.Scan(&r.Key, &r.Attempts); err != nil {
			return nil, fmt.Errorf("mysqlstore: lapsed: %w", err)
		}
		recs = append(recs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mysqlstore: lapsed: %w", err)
	}
	return recs, nil
}

// Claim implements [idem.Recoverable] in at most 2 round trips, both
// autocommitted: a SELECT of the row (what Claim returns, and whether it
// is due: 1 round trip when it is not), then an UPDATE that takes it over
// only if it is still due and still holds the token and attempts read
// (optimistic: of racing claims, the first UPDATE wins and the others
// match no row). Twice with the same token: the second finds the row
// leased to it, not due, and changes nothing. A deadlock (InnoDB's
// victim) is reported as not claimed: the row changed meanwhile.
func (s *Store) Claim(ctx context.Context, key, token string, lease, backoff time.Duration) (idem.RecoveryClaim, bool, error) {
	if lease <= 0 || backoff < 0 {
		return idem.RecoveryClaim{}, false, idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return idem.RecoveryClaim{}, false, err
	}
	if err := checkIDs(key, token); err != nil {
		return idem.RecoveryClaim{}, false, err
	}
	c, ok, err := s.claim(ctx, key, token, lease, backoff)
	if mysqlErrno(err) == erLockDeadlock {
		return idem.RecoveryClaim{}, false, nil
	}
	if err != nil {
		return idem.RecoveryClaim{}, false, fmt.Errorf("mysqlstore: claim: %w", err)
	}
	return c, ok, nil
}

func (s *Store) claim(ctx context.Context, key, token string, lease, backoff time.Duration) (idem.RecoveryClaim, bool, error) {
	var (
		c        idem.RecoveryClaim
		lapsedUS sql.NullInt64
		isDue    sql.NullBool
	)
	err := s.queryRow(ctx, s.q.claimRead, key).Scan(&c.PreviousToken, &c.Fingerprint, &c.Payload, &c.Attempts, &lapsedUS, &isDue)
	if errors.Is(err, sql.ErrNoRows) || err == nil && !isDue.Bool {
		return idem.RecoveryClaim{}, false, nil
	}
	if err != nil {
		return idem.RecoveryClaim{}, false, err
	}
	res, err := s.exec(ctx, s.q.claim, token, micros(backoff), micros(lease), key, c.PreviousToken, c.Attempts)
	if err != nil {
		return idem.RecoveryClaim{}, false, err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return idem.RecoveryClaim{}, false, err
	}
	c.Attempts++
	c.Lapsed = max(time.Duration(lapsedUS.Int64)*time.Microsecond, time.Microsecond)
	return c, true, nil
}

// ResolveStep implements [idem.StepResolver]: with a result, one
// conditional UPDATE of the uncertain or lapsed row holding step name, not
// done; without, a SELECT … FOR UPDATE of that row and an UPDATE in one
// transaction (see [Store.resolveStepUndone]). Either counts the row's
// recovery attempts from zero again, backoff 0.
func (s *Store) ResolveStep(ctx context.Context, key, name string, result []byte) error {
	if len(result) > idem.MaxStepBytes {
		return fmt.Errorf("mysqlstore: step result of %d bytes: %w", len(result), idem.ErrTooLarge)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkIDs(key); err != nil {
		return err
	}
	path, err := stepPath(name)
	if err != nil {
		return err
	}
	if result == nil {
		return s.resolveStepUndone(ctx, key, name, path)
	}
	res, err := s.exec(ctx, s.q.resolveStepDone, path, result, key, path, path)
	if err != nil {
		return fmt.Errorf("mysqlstore: resolve step: %w", err)
	}
	if ownedRow(res, "resolve step") != nil {
		return idem.ErrRecordChanged
	}
	return nil
}

// resolveStepUndone removes step name (at path) from the journal of key's
// uncertain or lapsed row, where it is started and not done, and moves each
// later entry's index down by one: the indexes stay 0 to n-1 in start
// order, as StartStep gives a new entry the index n (the journal's
// length). The row is read locked and written in one transaction.
func (s *Store) resolveStepUndone(ctx context.Context, key, name, path string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("mysqlstore: resolve step: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var raw string
	err = tx.QueryRowContext(ctx, s.q.resolveStepRead, key, path, path).Scan(&raw)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return idem.ErrRecordChanged
	case err != nil:
		return fmt.Errorf("mysqlstore: resolve step: %w", err)
	}
	var m map[string]map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return fmt.Errorf("%w: steps: %w", ErrCorrupt, err)
	}
	delete(m, name)
	var steps any // NULL for an empty journal
	if len(m) > 0 {
		type entry struct {
			name string
			i    int
		}
		order := make([]entry, 0, len(m))
		for n, e := range m {
			var i int
			if err := json.Unmarshal(e["i"], &i); err != nil {
				return fmt.Errorf("%w: steps: entry %q: %w", ErrCorrupt, n, err)
			}
			order = append(order, entry{n, i})
		}
		slices.SortFunc(order, func(a, b entry) int { return cmp.Or(cmp.Compare(a.i, b.i), strings.Compare(a.name, b.name)) })
		for i, e := range order {
			m[e.name]["i"] = json.RawMessage(strconv.Itoa(i))
		}
		b, err := json.Marshal(m)
		if err != nil {
			return fmt.Errorf("mysqlstore: resolve step: %w", err)
		}
		steps = string(b)
	}
	res, err := tx.ExecContext(ctx, s.q.resolveStepUndone, steps, key)
	if err != nil {
		return fmt.Errorf("mysqlstore: resolve step: %w", err)
	}
	if err := ownedRow(res, "resolve step"); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("mysqlstore: resolve step: %w", err)
	}
	return nil
}
