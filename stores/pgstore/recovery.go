package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	idem "github.com/idemkit/idem/core"
)

// Expressions of the recovery statements over a row r and the clock n.t.
const (
	// us is one microsecond: durations are passed and stored in µs.
	us = `interval '1 microsecond'`
	// due is true for a row due for recovery ([idem.Recoverable.Lapsed]):
	// in progress, with a payload, no Keep.Uncertain (such a row turns
	// uncertain when its lease lapses), not expired, its lease lapsed at
	// least the last claim's backoff ago.
	due = `(r.state = 1 AND r.recovery IS NOT NULL AND r.keep_uncertain IS NULL AND r.expires_at > n.t
  AND r.until_at + coalesce(r.backoff, 0)::float8 * ` + us + ` <= n.t)`
	// unresolved is true when row r's journal holds step $2, not done.
	unresolved = `EXISTS (SELECT 1 FROM jsonb_array_elements(r.steps) e WHERE e->>'n' = $2 AND NOT e ? 'r')`
	// settled is true for a row r whose step may be resolved: in progress
	// and kept past its lease (uncertain, or lapsed with a journal).
	settled = `r.state = 1 AND r.expires_at > n.t AND r.until_at <= n.t AND ` + unresolved
	// resumable sets the columns of a row r whose step was resolved: in
	// progress with its lease lapsed (no longer uncertain), kept for its
	// retain from now when it was uncertain, its recovery attempts and
	// backoff none again, due for recovery at once when it has a payload.
	resumable = `keep_uncertain = NULL, attempts = NULL, backoff = NULL,
  expires_at = CASE WHEN r.keep_uncertain > 0 THEN n.t + coalesce(r.retain, 0)::float8 * ` + us + ` ELSE r.expires_at END,
  due_at = CASE WHEN r.recovery IS NOT NULL THEN r.until_at END`
)

// addRecovery sets the statements of [idem.Recoverable] and
// [idem.StepResolver] on table t. Each is one statement; each is safe to
// run twice (a retried call whose reply was lost), as noted on it.
func (q *queries) addRecovery(t string) {
	// setRecovery is StartStep's conditional UPDATE of the token's leased
	// row, storing the payload instead of a step, and placing the row in
	// the due_at index at its lease end (plus the last claim's backoff).
	// Twice: the same payload stored again, the same retain.
	q.setRecovery = `UPDATE ` + t + ` r SET recovery = $3::bytea, recovery_lease = $5::bigint,
  retain = greatest(coalesce(r.retain, 0), $4::bigint),
  until_at = coalesce(r.until_at, r.expires_at),
  expires_at = CASE WHEN r.keep_uncertain > 0 THEN r.expires_at
    ELSE coalesce(r.until_at, r.expires_at) + greatest(coalesce(r.retain, 0), $4::bigint)::float8 * ` + us + ` END,
  due_at = CASE WHEN r.keep_uncertain IS NULL
    THEN coalesce(r.until_at, r.expires_at) + coalesce(r.backoff, 0)::float8 * ` + us + ` END
FROM ` + clock + ` WHERE r.key = $1 AND r.` + leased
	// lapsed is a range scan of the partial due_at index (statement_timestamp()
	// is stable, so the planner uses it), soonest due first. Every
	// transition keeps due_at exact (SetRecovery, Extend, Claim, takeover
	// set it; Complete, Suspend clear it; Release, Evict, purge delete the
	// row), so the range holds due rows only, and rows past expires_at
	// until the purge; due re-checks each. A read: safe twice.
	q.lapsed = `SELECT r.key, coalesce(r.attempts, 0) FROM ` + t + ` r, ` + clock + `
WHERE r.due_at <= statement_timestamp() AND ` + due + ` ORDER BY r.due_at LIMIT $1`
	// claim takes the due row over for token $2 (the lease kept with its
	// payload, or $3 µs for a payload stored without; backoff $4 µs), as a
	// takeover by acquire does (journal, payload, retain kept).
	// o locks the row first and reads its holder's token and lease end as
	// they were before the update (RETURNING reads the new row); a racing
	// claim waits for the lock, then finds the row no longer due, so
	// exactly one wins. Twice with the same token: the second finds the
	// row leased (to that token), not due, and changes nothing.
	q.claim = `UPDATE ` + t + ` r SET token = $2::text, attempts = coalesce(r.attempts, 0) + 1, backoff = $4::bigint,
  until_at = n.t + coalesce(r.recovery_lease, $3::bigint)::float8 * ` + us + `,
  expires_at = n.t + (coalesce(r.recovery_lease, $3::bigint) + coalesce(r.retain, 0))::float8 * ` + us + `,
  due_at = n.t + (coalesce(r.recovery_lease, $3::bigint) + $4::bigint)::float8 * ` + us + `
FROM ` + clock + `, (SELECT key, token, until_at FROM ` + t + ` WHERE key = $1 FOR UPDATE) o
WHERE r.key = $1 AND o.key = r.key AND ` + due + `
RETURNING r.recovery, r.fingerprint, r.attempts, o.token, (extract(epoch FROM n.t - o.until_at) * 1000000)::bigint`
	// resolveStepDone and resolveStepUndone settle step $2 of an uncertain
	// or lapsed row: done with result $3, or removed (a journal left empty
	// is NULL, as a record's without steps). Twice: the step is then done
	// or absent, so the second changes nothing (ErrRecordChanged).
	q.resolveStepDone = `UPDATE ` + t + ` r SET steps = (SELECT jsonb_agg(CASE WHEN e->>'n' = $2 AND NOT e ? 'r'
    THEN e || jsonb_build_object('r', encode($3::bytea, 'base64')) ELSE e END ORDER BY i)
  FROM jsonb_array_elements(r.steps) WITH ORDINALITY x(e, i)), ` + resumable + `
FROM ` + clock + ` WHERE r.key = $1 AND ` + settled
	q.resolveStepUndone = `UPDATE ` + t + ` r SET steps = (SELECT jsonb_agg(e ORDER BY i)
  FROM jsonb_array_elements(r.steps) WITH ORDINALITY x(e, i) WHERE e->>'n' <> $2), ` + resumable + `
FROM ` + clock + ` WHERE r.key = $1 AND ` + settled
}

// SetRecovery implements [idem.Recoverable]: one conditional UPDATE of the
// token's leased row.
func (s *Store) SetRecovery(ctx context.Context, key, token string, payload []byte, retain, lease time.Duration) error {
	switch {
	case retain <= 0 || lease <= 0:
		return idem.ErrInvalidDuration
	case len(payload) > idem.MaxRecoveryBytes:
		return fmt.Errorf("pgstore: recovery payload of %d bytes: %w", len(payload), idem.ErrTooLarge)
	case len(payload) == 0:
		return errors.New("pgstore: empty recovery payload")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, s.q.setRecovery, key, token, payload, keepMicros(retain), keepMicros(lease))
	if err != nil {
		return fmt.Errorf("pgstore: set recovery: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrNotOwner
	}
	return nil
}

// Lapsed implements [idem.Recoverable]: one SELECT, a range scan of the
// partial due_at index, soonest due first.
func (s *Store) Lapsed(ctx context.Context, limit int) ([]idem.LapsedRecord, error) {
	if limit <= 0 {
		return nil, errors.New("pgstore: lapsed: limit must be > 0")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, s.q.lapsed, limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: lapsed: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (idem.LapsedRecord, error) {
		var r idem.LapsedRecord
		err := row.Scan(&r.Key, &r.Attempts)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: lapsed: %w", err)
	}
	return recs, nil
}

// Claim implements [idem.Recoverable]: one conditional UPDATE of the due
// row, for the lease its recovery_lease holds. At REPEATABLE READ or SERIALIZABLE a racing transition makes it
// fail with SQLSTATE 40001 having changed nothing: the record changed
// since it was due, and Claim reports it not claimed.
func (s *Store) Claim(ctx context.Context, key, token string, lease, backoff time.Duration) (idem.RecoveryClaim, bool, error) {
	if lease <= 0 || backoff < 0 {
		return idem.RecoveryClaim{}, false, idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return idem.RecoveryClaim{}, false, err
	}
	var (
		c        idem.RecoveryClaim
		lapsedUS int64
	)
	err := s.pool.QueryRow(ctx, s.q.claim, key, token, keepMicros(lease), keepMicros(backoff)).
		Scan(&c.Payload, &c.Fingerprint, &c.Attempts, &c.PreviousToken, &lapsedUS)
	switch {
	case errors.Is(err, pgx.ErrNoRows), serializationFailure(err):
		return idem.RecoveryClaim{}, false, nil
	case err != nil:
		return idem.RecoveryClaim{}, false, fmt.Errorf("pgstore: claim: %w", err)
	}
	c.Lapsed = max(time.Duration(lapsedUS)*time.Microsecond, time.Microsecond)
	return c, true, nil
}

// ResolveStep implements [idem.StepResolver]: one conditional UPDATE of
// the uncertain or lapsed row holding step name, not done, which also
// counts its recovery attempts from zero again, backoff 0.
func (s *Store) ResolveStep(ctx context.Context, key, name string, result []byte) error {
	if len(result) > idem.MaxStepBytes {
		return fmt.Errorf("pgstore: step result of %d bytes: %w", len(result), idem.ErrTooLarge)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var err error
	var n int64
	if result == nil {
		tag, e := s.pool.Exec(ctx, s.q.resolveStepUndone, key, name)
		n, err = tag.RowsAffected(), e
	} else {
		tag, e := s.pool.Exec(ctx, s.q.resolveStepDone, key, name, result)
		n, err = tag.RowsAffected(), e
	}
	if err != nil {
		return fmt.Errorf("pgstore: resolve step: %w", err)
	}
	if n == 0 {
		return idem.ErrRecordChanged
	}
	return nil
}
