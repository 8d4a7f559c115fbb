package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemkit/idem/core"
)

// DefaultTable is the table used without [WithTable].
const DefaultTable = "idem_records"

// ErrContention is returned (wrapped) by Acquire when the record changed
// under it on every attempt (each time a concurrent request created, took
// over or deleted it between the statement's snapshot and its insert). It is
// a system failure: the engine answers 503 and executes nothing.
var ErrContention = errors.New("pgstore: record changed on every acquire attempt")

// ErrTooLarge is returned (wrapped) by Complete when the encoded response
// exceeds PostgreSQL's 1 GB field limit. Nothing is written and the lease
// (and the execution's transaction) stay as they were. The engine's
// WithMaxResponseBytes (1 MiB by default) keeps responses far below it.
var ErrTooLarge = fmt.Errorf("pgstore: response exceeds PostgreSQL's 1 GB field limit: %w", idem.ErrTooLarge)

// ErrCorrupt is returned (wrapped) when a row holds a state or response this
// package did not write. It wraps [idem.ErrCorrupt]: the engine answers 500
// "stored-result-unreadable" until the row is deleted.
var ErrCorrupt = fmt.Errorf("pgstore: corrupt record: %w", idem.ErrCorrupt)

// Values of the state column (1, 2), and the states reads derive from the
// time (3, 4), equal to their [idem.State].
const (
	stateInProgress int16 = 1
	stateCompleted  int16 = 2
	stateUncertain  int16 = 3
	stateExpired    int16 = 4
)

// maxField is PostgreSQL's limit on one field value (1 GB), less room for
// the varlena header.
const maxField = 1<<30 - 1024

// maxAcquireAttempts bounds Acquire's retries when a concurrent transition
// leaves its statement with nothing to return.
const maxAcquireAttempts = 5

var (
	_ idem.Store         = (*Store)(nil)
	_ idem.Extender      = (*Store)(nil)
	_ idem.Transactional = (*Store)(nil)
	_ idem.Keeper        = (*Store)(nil)
	_ idem.Journal       = (*Store)(nil)
	_ idem.Recoverable   = (*Store)(nil)
	_ idem.StepResolver  = (*Store)(nil)
)

// Store is an idem.Store on PostgreSQL, safe for concurrent use. It borrows
// its pool and never closes it.
type Store struct {
	pool  *pgxpool.Pool
	table string // quoted, possibly schema-qualified
	index string // quoted name of the expires_at index, unqualified
	// untilIndex is the quoted name of the partial until_at index, unqualified.
	untilIndex string
	// dueIndex is the quoted name of the partial due_at index, unqualified.
	dueIndex string
	logger     *slog.Logger
	q          queries

	mu      sync.Mutex
	closed  bool
	stop    context.CancelFunc
	stopped chan struct{}
}

// Option configures a Store.
type Option func(*Store)

// WithTable sets the table holding the records, "table" or "schema.table"
// (each part quoted as an SQL identifier, so case and any characters are
// kept as given). Optional. Default is "idem_records" ([DefaultTable]) in
// the connection's search_path.
func WithTable(name string) Option {
	return func(s *Store) {
		parts := strings.SplitN(name, ".", 2)
		s.table = pgx.Identifier(parts).Sanitize()
		s.index = pgx.Identifier{parts[len(parts)-1] + "_expires_at"}.Sanitize()
		s.untilIndex = pgx.Identifier{parts[len(parts)-1] + "_until_at"}.Sanitize()
		s.dueIndex = pgx.Identifier{parts[len(parts)-1] + "_due_at"}.Sanitize()
	}
}

// WithLogger sets the logger for the purger's failures. Optional. Default
// is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.logger = l } }

// New returns a Store keeping its records in a table of pool's database
// (create it with [Store.EnsureSchema] or the SQL of [Store.SchemaSQL]). It
// does no I/O; the pool stays the caller's to configure and close. Use the
// pool of the service's own database so that handlers can write through
// [Tx] in the same transaction as the completed record.
func New(pool *pgxpool.Pool, opts ...Option) *Store {
	s := &Store{pool: pool}
	WithTable(DefaultTable)(s)
	for _, o := range opts {
		o(s)
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	s.q = newQueries(s.table)
	s.q.addRecovery(s.table)
	return s
}

// queries are the statements of one table. Times come from the server's
// clock_timestamp(), never the instance's clock and never now(): now() is
// frozen at the start of the transaction, and a completion runs at the end
// of the handler's transaction (the purge alone uses statement_timestamp()).
// A statement that judges a row more than once reads the clock once, in
// the one-row subquery n, so that its judgements agree. Durations are
// passed in microseconds.
type queries struct {
	acquire, complete, release, extend, get, completedBy, purge, free, resolveRelease, resolveComplete string
	startStep, finishStep, suspend, steps, stepRefused                                                 string
	setRecovery, lapsed, claim, resolveStepDone, resolveStepUndone                                     string
}

// Expressions over a row r of the table and the clock n.t (see [Store.SchemaSQL]).
const (
	// phaseEnd is the end of the lease (in progress) or of the retention
	// (completed): until_at when the record has a keep, else expires_at.
	phaseEnd = `coalesce(r.until_at, r.expires_at)`
	// stateOf is the state of a live row as [idem.State]: past its phase
	// end, an in-progress row is uncertain (3) and a completed one a
	// tombstone (4); a row past expires_at (listed only) keeps its column.
	// A lapsed in-progress row kept for its step journal (retain, no
	// keep_uncertain) is still in progress: the next acquire takes it over.
	stateOf = `CASE WHEN ` + phaseEnd + ` > n.t OR r.expires_at <= n.t THEN r.state WHEN r.state = 1 AND r.keep_uncertain > 0 THEN 3::smallint
  WHEN r.state = 1 THEN 1::smallint ELSE 4::smallint END`
	// tombstone is true for a completed row past its retention.
	tombstone = `(r.state = 2 AND r.until_at <= n.t)`
	// tokenOf and responseOf are what reads return: a tombstone has
	// neither (the purger frees them; reads never return them before).
	tokenOf    = `CASE WHEN ` + tombstone + ` THEN ''::text ELSE r.token END`
	responseOf = `CASE WHEN ` + tombstone + ` THEN NULL::bytea ELSE r.response END`
	// clock is the one-row subquery n.
	clock = `(SELECT clock_timestamp() AS t) n`
	// uncertain is true for an uncertain row (given n.t).
	uncertain = `state = 1 AND until_at <= n.t AND expires_at > n.t AND keep_uncertain > 0`
	// owned is true for the in-progress row of token $2 whose lease is
	// live, or which is uncertain (its owner may still end it).
	owned = `state = 1 AND token = $2 AND expires_at > n.t AND (keep_uncertain > 0 OR coalesce(until_at, expires_at) > n.t)`
	// leased is true for the in-progress row of token $2 whose lease is live.
	leased = `state = 1 AND token = $2 AND coalesce(until_at, expires_at) > n.t`
	// held is true for a row r whose lease lapsed and which is kept for
	// its step journal: taken over by the next acquire.
	held = `(r.state = 1 AND r.keep_uncertain IS NULL AND coalesce(r.until_at <= n.t, false))`
	// lapse is how long an in-progress row outlives its lease, in µs.
	lapse = `coalesce(nullif(keep_uncertain, 0), retain, 0)`
)

// completion sets a completed record's columns: the response in parameter
// resp, for retention (µs, parameter ret) from n.t, and its tombstone after
// it (the keep the record was acquired with).
func completion(resp, ret string) string {
	return `state = 2, response = ` + resp + `,
  expires_at = n.t + (` + ret + `::float8 + coalesce(keep_tombstone, 0)) * interval '1 microsecond',
  until_at = CASE WHEN keep_tombstone > 0 THEN n.t + ` + ret + `::float8 * interval '1 microsecond' END,
  keep_uncertain = NULL, keep_tombstone = NULL, recovery = NULL, due_at = NULL`
}

// resumes is true, in an acquire's ON CONFLICT update of row r, when the
// new holder resumes r's journal: r is in progress, still kept (its lease
// lapsed within its retain, or it is the token's own retried acquire), and
// has the same fingerprint.
const resumes = `(r.state = 1 AND r.expires_at > clock_timestamp() AND r.fingerprint = EXCLUDED.fingerprint
  AND (r.steps IS NOT NULL OR r.recovery IS NOT NULL))`

func newQueries(t string) queries {
	return queries{
		// cur is the live record as of the statement's snapshot, unless it
		// is this token's own in-progress record (a retried acquire). When
		// there is none, ins creates the record, or takes over an expired
		// one; the ON CONFLICT condition is re-checked on the latest row
		// version, so among racing takeovers exactly one wins. An
		// uncertain record or a tombstone is live until its keep ends
		// (expires_at), so it is returned, never taken over. No row at
		// all means a concurrent transition the snapshot did not see: retry.
		acquire: `WITH n AS (SELECT clock_timestamp() AS t), cur AS MATERIALIZED (
  SELECT ` + stateOf + ` AS state, ` + tokenOf + ` AS token, r.fingerprint, ` + responseOf + ` AS response,
    (extract(epoch FROM ` + phaseEnd + ` - n.t) * 1000000)::bigint AS left_us FROM ` + t + ` r, n
  WHERE r.key = $1::text AND r.expires_at > n.t AND NOT (r.state = 1 AND r.token = $2::text)
    AND NOT (` + held + ` AND (r.fingerprint = $3::text OR r.steps IS NULL))
), prev AS MATERIALIZED (
  SELECT r.token, (extract(epoch FROM ` + phaseEnd + ` - n.t) * 1000000)::bigint AS left_us FROM ` + t + ` r, n
  WHERE r.key = $1::text AND r.state = 1 AND r.token <> $2::text AND ` + phaseEnd + ` <= n.t
), ins AS (
  INSERT INTO ` + t + ` AS r (key, state, token, fingerprint, response, expires_at, until_at, keep_uncertain, keep_tombstone)
  SELECT $1::text, 1, $2::text, $3::text, NULL, n.t + ($4::float8 + $5::bigint) * interval '1 microsecond',
    CASE WHEN $5::bigint > 0 THEN n.t + $4::float8 * interval '1 microsecond' END, nullif($5::bigint, 0), nullif($6::bigint, 0)
  FROM n WHERE NOT EXISTS (SELECT 1 FROM cur)
  ON CONFLICT (key) DO UPDATE SET state = 1, token = EXCLUDED.token, fingerprint = EXCLUDED.fingerprint,
    response = NULL, keep_uncertain = EXCLUDED.keep_uncertain, keep_tombstone = EXCLUDED.keep_tombstone,
    steps = CASE WHEN ` + resumes + ` THEN r.steps END,
    retain = CASE WHEN ` + resumes + ` THEN r.retain END,
    recovery = CASE WHEN ` + resumes + ` THEN r.recovery END,
    attempts = CASE WHEN ` + resumes + ` THEN r.attempts END,
    backoff = CASE WHEN ` + resumes + ` THEN r.backoff END,
    due_at = CASE WHEN ` + resumes + ` AND r.recovery IS NOT NULL AND EXCLUDED.keep_uncertain IS NULL
      THEN EXCLUDED.expires_at + coalesce(r.backoff, 0)::float8 * interval '1 microsecond' END,
    expires_at = EXCLUDED.expires_at + CASE WHEN ` + resumes + ` AND EXCLUDED.keep_uncertain IS NULL
      THEN r.retain::float8 * interval '1 microsecond' ELSE interval '0' END,
    until_at = CASE WHEN ` + resumes + ` AND EXCLUDED.until_at IS NULL THEN EXCLUDED.expires_at ELSE EXCLUDED.until_at END
  WHERE r.expires_at <= clock_timestamp() OR (r.state = 1 AND r.token = EXCLUDED.token)
    OR (r.state = 1 AND r.keep_uncertain IS NULL AND r.until_at <= clock_timestamp() AND (r.fingerprint = EXCLUDED.fingerprint OR r.steps IS NULL))
  RETURNING 1
)
SELECT true, 0::smallint, coalesce((SELECT token FROM prev), ''), ''::text, NULL::bytea, coalesce((SELECT left_us FROM prev), 0) FROM ins
UNION ALL
SELECT false, state, token, fingerprint, response, left_us FROM cur`,
		// The owner's in-progress row, live or uncertain (expires_at is
		// the end of the lease plus its Keep.Uncertain).
		complete: `UPDATE ` + t + ` SET ` + completion("$3", "$4") + `
FROM ` + clock + ` WHERE key = $1 AND ` + owned,
		release: `DELETE FROM ` + t + ` USING ` + clock + ` WHERE key = $1 AND ` + owned,
		extend: `UPDATE ` + t + ` SET expires_at = n.t + ($3::float8 + ` + lapse + `) * interval '1 microsecond',
  until_at = CASE WHEN keep_uncertain > 0 OR retain > 0 THEN n.t + $3::float8 * interval '1 microsecond' END,
  due_at = CASE WHEN due_at IS NOT NULL THEN n.t + ($3::float8 + coalesce(backoff, 0)) * interval '1 microsecond' END
FROM ` + clock + ` WHERE key = $1 AND ` + owned,
		// The journal (steps) is a jsonb array of {"n": name, "t": token,
		// "r": base64 result once done}, in start order. startStep adds
		// the entry unless it is there or the journal is full, sets the
		// retain, and returns the entry.
		startStep: `UPDATE ` + t + ` r SET
  steps = CASE WHEN ` + hasStep + ` THEN r.steps ELSE coalesce(r.steps, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('n', $3::text, 't', $2::text)) END,
  retain = greatest(coalesce(r.retain, 0), $4::bigint),
  until_at = coalesce(r.until_at, r.expires_at),
  expires_at = CASE WHEN r.keep_uncertain > 0 THEN r.expires_at
    ELSE coalesce(r.until_at, r.expires_at) + greatest(coalesce(r.retain, 0), $4::bigint)::float8 * interval '1 microsecond' END
FROM ` + clock + ` WHERE r.key = $1 AND r.` + leased + `
  AND (` + hasStep + ` OR coalesce(jsonb_array_length(r.steps), 0) < ` + strconv.Itoa(idem.MaxSteps) + `)
RETURNING (SELECT e->>'t' FROM jsonb_array_elements(r.steps) e WHERE e->>'n' = $3 LIMIT 1),
  (SELECT decode(e->>'r', 'base64') FROM jsonb_array_elements(r.steps) e WHERE e->>'n' = $3 LIMIT 1),
  (SELECT e ? 'r' FROM jsonb_array_elements(r.steps) e WHERE e->>'n' = $3 LIMIT 1)`,
		// stepRefused tells why startStep changed nothing: true when the
		// token holds the lease (so the journal is full).
		stepRefused: `SELECT EXISTS (SELECT 1 FROM ` + t + `, ` + clock + ` WHERE key = $1 AND ` + leased + `)`,
		finishStep: `UPDATE ` + t + ` r SET steps = (SELECT jsonb_agg(CASE WHEN e->>'n' = $3 AND NOT e ? 'r'
    THEN e || jsonb_build_object('r', encode($4::bytea, 'base64')) ELSE e END ORDER BY i)
  FROM jsonb_array_elements(r.steps) WITH ORDINALITY x(e, i))
FROM ` + clock + ` WHERE r.key = $1 AND r.` + leased + ` AND ` + hasStep,
		suspend: `UPDATE ` + t + ` SET until_at = n.t, keep_uncertain = $3::bigint, due_at = NULL,
  expires_at = n.t + $3::float8 * interval '1 microsecond'
FROM ` + clock + ` WHERE key = $1 AND ` + leased,
		steps: `SELECT e->>'n', e->>'t', e ? 'r', decode(e->>'r', 'base64')
FROM ` + t + ` r, ` + clock + `, jsonb_array_elements(r.steps) WITH ORDINALITY x(e, i)
WHERE r.key = $1 AND r.expires_at > n.t AND NOT coalesce(` + tombstone + `, false) ORDER BY i`,
		get: `SELECT ` + stateOf + `, ` + tokenOf + `, r.fingerprint, ` + responseOf + ` FROM ` + t + ` r, ` + clock + `
WHERE r.key = $1 AND r.expires_at > n.t`,
		completedBy: `SELECT EXISTS (SELECT 1 FROM ` + t + `
WHERE key = $1 AND token = $2 AND state = 2 AND expires_at > clock_timestamp())`,
		// statement_timestamp(), stable within the statement, unlike the
		// volatile clock_timestamp(), lets the planner scan the expires_at
		// index. SKIP LOCKED: a row being taken over or completed right now
		// is left for the next purge instead of blocking this one.
		purge: `DELETE FROM ` + t + ` WHERE key IN (
  SELECT key FROM ` + t + ` WHERE expires_at <= statement_timestamp() LIMIT $1 FOR UPDATE SKIP LOCKED)`,
		// free empties the tombstones whose retention ended, through the
		// partial until_at index (rows with a response and a keep only).
		free: `UPDATE ` + t + ` SET response = NULL, token = '', steps = NULL WHERE key IN (
  SELECT key FROM ` + t + ` WHERE until_at <= statement_timestamp() AND response IS NOT NULL AND state = 2
  LIMIT $1 FOR UPDATE SKIP LOCKED) AND state = 2 AND until_at <= statement_timestamp()`,
		resolveRelease: `DELETE FROM ` + t + ` USING ` + clock + ` WHERE key = $1 AND ` + uncertain,
		// token '': the former owner's unit, asking whether its own commit
		// landed (completedBy), must not take the operator's answer for it.
		resolveComplete: `UPDATE ` + t + ` SET ` + completion("$2", "$3") + `, token = ''
FROM ` + clock + ` WHERE key = $1 AND ` + uncertain,
	}
}

// hasStep is true when row r's journal has an entry named $3.
const hasStep = `coalesce(r.steps @> jsonb_build_array(jsonb_build_object('n', $3::text)), false)`

// micros returns d in microseconds, rounded up (a 1ns lease is 1µs).
func micros(d time.Duration) float64 {
	return float64((d + time.Microsecond - 1) / time.Microsecond)
}

// keepMicros returns a keep duration in microseconds, rounded up; 0 for 0.
func keepMicros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

func toRecord(state int16, token, fp string, raw []byte) (idem.Record, error) {
	rec := idem.Record{Token: token, Fingerprint: fp}
	switch state {
	case stateInProgress:
		rec.State = idem.StateInProgress
	case stateCompleted:
		rec.State = idem.StateCompleted
		if len(raw) == 0 {
			return idem.Record{}, fmt.Errorf("%w: completed without a response", ErrCorrupt)
		}
		rec.Response = raw // pgx copies a bytea on scan: the caller's
	case stateUncertain:
		rec.State = idem.StateUncertain
	case stateExpired:
		rec.State = idem.StateExpired
	default:
		return idem.Record{}, fmt.Errorf("%w: state %d", ErrCorrupt, state)
	}
	return rec, nil
}

// checkSize refuses a response above PostgreSQL's bytea limit.
func checkSize(response []byte) error {
	if len(response) > maxField {
		return fmt.Errorf("%w (%d bytes)", ErrTooLarge, len(response))
	}
	return nil
}

// Acquire implements [idem.Store]: AcquireKeep with the zero [idem.Keep].
func (s *Store) Acquire(ctx context.Context, key, token, fingerprint string, lease time.Duration) (idem.Record, bool, error) {
	return s.AcquireKeep(ctx, key, token, fingerprint, lease, idem.Keep{})
}

// AcquireKeep implements [idem.Keeper]: one INSERT … ON CONFLICT statement
// that creates the record, takes over an expired one, or returns the live
// one (an in-progress one with its [idem.Record.LeaseLeft], the end of its
// lease minus the server's clock_timestamp(); an uncertain one with its
// owner's token; a tombstone without token or response). The keep is
// stored with the record: until_at (end of the lease) and expires_at (end
// of the lease plus keep.Uncertain), and both keep durations, which
// Extend and Complete read from the row.
func (s *Store) AcquireKeep(ctx context.Context, key, token, fingerprint string, lease time.Duration, keep idem.Keep) (idem.Record, bool, error) {
	if lease <= 0 || keep.Uncertain < 0 || keep.Tombstone < 0 {
		return idem.Record{}, false, idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	for range maxAcquireAttempts {
		var (
			acquired bool
			state    int16
			tok, fp  string
			raw      []byte
			leftUS   int64 // the live record's time left, by the server's clock
		)
		err := s.pool.QueryRow(ctx, s.q.acquire, key, token, fingerprint, micros(lease),
			keepMicros(keep.Uncertain), keepMicros(keep.Tombstone)).Scan(&acquired, &state, &tok, &fp, &raw, &leftUS)
		switch {
		case errors.Is(err, pgx.ErrNoRows), serializationFailure(err):
			continue // a concurrent transition this statement's snapshot missed
		case err != nil:
			return idem.Record{}, false, fmt.Errorf("pgstore: acquire: %w", err)
		case acquired && tok != "": // took over a lapsed lease
			return idem.Record{State: idem.StateInProgress, Token: tok, LeaseLeft: min(time.Duration(leftUS)*time.Microsecond, -1)}, true, nil
		case acquired:
			return idem.Record{}, true, nil
		}
		rec, err := toRecord(state, tok, fp, raw)
		if rec.State == idem.StateInProgress {
			rec.LeaseLeft = max(time.Duration(leftUS)*time.Microsecond, 1) // live: the lease's end was ahead
		}
		return rec, false, err
	}
	return idem.Record{}, false, ErrContention
}

// serializationFailure reports SQLSTATE 40001: at REPEATABLE READ or
// SERIALIZABLE (default_transaction_isolation), the acquire statement
// found its row changed by a racing transition after its snapshot. The
// statement had no effect, and the next attempt's snapshot sees the row.
func serializationFailure(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "40001"
}

// Complete implements [idem.Store]: one conditional UPDATE of the token's
// in-progress row, live or uncertain. The token is kept in the completed
// row (so a completion whose reply was lost can be recognised); the row
// carries the Keep.Tombstone it was acquired with past the retention.
func (s *Store) Complete(ctx context.Context, key, token string, response []byte, retention time.Duration) error {
	if retention <= 0 {
		return idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkSize(response); err != nil {
		return err
	}
	return s.complete(ctx, s.pool, key, token, response, retention)
}

// execer is what both the pool and a transaction run statements with.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func (s *Store) complete(ctx context.Context, db execer, key, token string, b []byte, retention time.Duration) error {
	tag, err := db.Exec(ctx, s.q.complete, key, token, b, micros(retention))
	if err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrNotOwner
	}
	return nil
}

// Release implements [idem.Store]: one conditional DELETE of the token's
// in-progress row, live or uncertain.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, s.q.release, key, token)
	if err != nil {
		return fmt.Errorf("pgstore: release: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrNotOwner
	}
	return nil
}

// Extend implements [idem.Extender]: one conditional UPDATE of the token's
// in-progress row, live or uncertain, keeping its Keep.Uncertain after the
// new lease.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if lease <= 0 {
		return idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, s.q.extend, key, token, micros(lease))
	if err != nil {
		return fmt.Errorf("pgstore: extend: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrNotOwner
	}
	return nil
}

// Get implements [idem.Store]: one SELECT of the live row (uncertain
// records and tombstones included, in their states).
func (s *Store) Get(ctx context.Context, key string) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	var (
		state   int16
		tok, fp string
		raw     []byte
	)
	err := s.pool.QueryRow(ctx, s.q.get, key).Scan(&state, &tok, &fp, &raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Record{}, false, nil
	}
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("pgstore: get: %w", err)
	}
	rec, err := toRecord(state, tok, fp, raw)
	return rec, err == nil, err
}

// Resolve implements [idem.Keeper]: one conditional statement on an
// uncertain row (in progress, lease ended, keep not): a DELETE when
// response is nil, else an UPDATE completing it for retention, and its
// tombstone after it, with no owner token. [idem.ErrRecordChanged] when
// the key holds no uncertain record.
func (s *Store) Resolve(ctx context.Context, key string, response []byte, retention time.Duration) error {
	if response != nil && retention <= 0 {
		return idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var (
		tag pgconn.CommandTag
		err error
	)
	if response == nil {
		tag, err = s.pool.Exec(ctx, s.q.resolveRelease, key)
	} else {
		if err := checkSize(response); err != nil {
			return err
		}
		tag, err = s.pool.Exec(ctx, s.q.resolveComplete, key, response, micros(retention))
	}
	if err != nil {
		return fmt.Errorf("pgstore: resolve: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrRecordChanged
	}
	return nil
}

// completedBy reports whether key holds a live record completed by token.
func (s *Store) completedBy(ctx context.Context, key, token string) (bool, error) {
	var ok bool
	if err := s.pool.QueryRow(ctx, s.q.completedBy, key, token).Scan(&ok); err != nil {
		return false, fmt.Errorf("pgstore: check completion: %w", err)
	}
	return ok, nil
}
