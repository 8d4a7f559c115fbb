package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	idem "github.com/idemkit/idem/core"
)

// DefaultTable is the table used without [WithTable].
const DefaultTable = "idem_records"

// MaxIDLength is the longest key, token or fingerprint the table holds
// (VARBINARY(255)); the engine's are 64 hex characters (keys and
// fingerprints) and 26 characters (tokens). Longer ones are refused with
// [ErrInvalidID] before any I/O, never truncated.
const MaxIDLength = 255

// ErrInvalidID is returned (wrapped) by a Store method given a key, token
// or fingerprint longer than [MaxIDLength] bytes. Nothing is written.
var ErrInvalidID = errors.New("mysqlstore: key, token or fingerprint longer than 255 bytes")

// ErrContention is returned (wrapped) by Acquire when the record changed
// under it on every attempt (each time a concurrent request deleted, took
// over or let expire the record it had just seen), or InnoDB chose it as a
// deadlock victim every time. It is a system failure: the engine answers
// 503 and executes nothing.
var ErrContention = errors.New("mysqlstore: record changed on every acquire attempt")

// ErrTooLarge is returned (wrapped) by Complete when the server refuses the
// encoded response as larger than its max_allowed_packet (16 MiB by
// default on MariaDB, 64 MiB on MySQL 8), or it exceeds the driver's
// Config.MaxAllowedPacket. Nothing is written and the lease (and the
// execution's transaction) stay as they were, unless the server closed
// the connection, which rolls the transaction back. The engine's
// WithMaxResponseBytes (1 MiB by default) keeps responses far below it.
var ErrTooLarge = fmt.Errorf("mysqlstore: response exceeds max_allowed_packet: %w", idem.ErrTooLarge)

// ErrCorrupt is returned (wrapped) when a row holds a state or response this
// package did not write. It wraps [idem.ErrCorrupt]: the engine answers 500
// "stored-result-unreadable" until the row is deleted.
var ErrCorrupt = fmt.Errorf("mysqlstore: corrupt record: %w", idem.ErrCorrupt)

// Values of the state column, and of the state the statements derive from
// a row by the server's clock (the numbers of [idem.State]): a row stores
// 1, 2 or 4; 3 (uncertain) is only ever derived, from an in-progress row
// whose lease (ends_at) lapsed while its keep (expires_at) has not ended.
const (
	stateInProgress int8 = 1
	stateCompleted  int8 = 2
	stateUncertain  int8 = 3
	stateExpired    int8 = 4 // a tombstone: fingerprint kept, response freed
)

// maxAcquireAttempts bounds Acquire's retries when a concurrent transition
// leaves its call with nothing to return, or InnoDB rolls it back as a
// deadlock victim.
const maxAcquireAttempts = 5

// MySQL error numbers the store reacts to.
const (
	erLockDeadlock   = 1213 // ER_LOCK_DEADLOCK: the statement was rolled back
	erNetPacketLarge = 1153 // ER_NET_PACKET_TOO_LARGE (MariaDB, for a long parameter too)
)

var (
	_ idem.Store         = (*Store)(nil)
	_ idem.Extender      = (*Store)(nil)
	_ idem.Transactional = (*Store)(nil)
	_ idem.Inspector     = (*Store)(nil)
	_ idem.Keeper        = (*Store)(nil)
)

// Store is an idem.Store on MySQL 8 or MariaDB (InnoDB), safe for
// concurrent use. It borrows its *sql.DB and never closes it.
type Store struct {
	db     *sql.DB
	table  string // quoted, possibly database-qualified
	proc   string // quoted acquire procedure, same database as the table
	names  names
	logger *slog.Logger
	q      queries

	stmtMu sync.Mutex
	stmts  map[string]*sql.Stmt // prepared on first use, closed by Close

	mu      sync.Mutex
	closed  bool
	stop    context.CancelFunc
	stopped chan struct{}
}

// names are the unquoted parts of the table's name.
type names struct{ schema, table string }

// Option configures a Store.
type Option func(*Store)

// WithTable sets the table holding the records, "table" or
// "database.table" (each part quoted as an identifier, so case and any
// characters are kept as given). The acquire procedure is named after it
// (table + [ProcSuffix], in the same database), so the name must leave room
// for that suffix within MySQL's 64 characters. Optional. Default is
// "idem_records" ([DefaultTable]) in the connection's database.
func WithTable(name string) Option {
	return func(s *Store) {
		if db, t, ok := strings.Cut(name, "."); ok {
			s.names = names{db, t}
			s.table = quote(db) + "." + quote(t)
			s.proc = quote(db) + "." + quote(t+ProcSuffix)
		} else {
			s.names = names{"", name}
			s.table = quote(name)
			s.proc = quote(name + ProcSuffix)
		}
	}
}

// quote quotes an identifier with backticks.
func quote(id string) string { return "`" + strings.ReplaceAll(id, "`", "``") + "`" }

// WithLogger sets the logger for the purger's failures and for a handler
// that ended its execution's transaction itself. Optional. Default is
// slog.Default().
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.logger = l } }

// New returns a Store keeping its records in a table of db's database
// (create it with [Store.EnsureSchema] or the statements of
// [Store.SchemaSQL]). It does no I/O; db stays the caller's to configure
// and close. Use the *sql.DB of the service's own database so that
// handlers can write through [Tx] in the same transaction as the completed
// record.
func New(db *sql.DB, opts ...Option) *Store {
	s := &Store{db: db, stmts: map[string]*sql.Stmt{}}
	WithTable(DefaultTable)(s)
	for _, o := range opts {
		o(s)
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	s.q = newQueries(s.table, s.proc)
	s.q.addRecovery(s.table)
	return s
}

// queries are the statements of one table. Every time is the server's
// UTC_TIMESTAMP(6): the time the statement began, in UTC whatever the
// session's time_zone, never the instance's clock (MySQL and MariaDB, unlike
// PostgreSQL's now(), do not freeze it at the start of a transaction, so a
// completion at the end of a long transaction judges its lease by the time
// it runs). Durations are passed in microseconds.
type queries struct {
	acquire, acquireKeep, complete, release, extend, get, completedBy, inspect, evict, list string
	resolveRelease, resolveComplete                                                         string
	startStep, stepOf, finishStep, suspend, steps                                           string
	setRecovery, leasedBy, lapsed, claimRead, claim, resolveStepDone, resolveStepUndone     string
	purgeSelect, purgeDelete, purgeFree                                                     string
}

// SQL fragments on a row, by the server's clock (see [Store.SchemaSQL] for
// what each column holds).
const (
	now = `UTC_TIMESTAMP(6)`
	// live: the row is not gone. expires_at is when it goes, except for a
	// completed row kept as a tombstone whose response is not freed yet:
	// expires_at is its response's end, and it goes keep_tombstone later.
	// Never NULL (keep_tombstone is tested first), so NOT live is safe.
	live = `(expires_at > ` + now + ` OR (state = 2 AND keep_tombstone IS NOT NULL AND expires_at + INTERVAL keep_tombstone MICROSECOND > ` + now + `))`
	// shown is the state of a live row (idem.State's numbers): an
	// in-progress row whose lease (ends_at, set only under a keep) lapsed
	// is uncertain (3) until its keep ends; a completed row past its
	// response's end is a tombstone (4). A gone in-progress row shows 1
	// (List lists it, as a lapsed lease).
	shown = `IF(state = 1, IF(ends_at <= ` + now + ` AND expires_at > ` + now + ` AND keep_uncertain IS NOT NULL, 3, 1), IF(state = 2 AND expires_at <= ` + now + `, 4, state))`
	// ttlAt is when the live row changes state or goes: the lease's end
	// (in progress), the response's end (completed), the keep's end
	// (uncertain, tombstone).
	ttlAt = `IF(state = 1 AND (ends_at > ` + now + ` OR keep_uncertain IS NULL AND ends_at IS NOT NULL), ends_at, IF(state = 2 AND expires_at <= ` + now +
		` AND keep_tombstone IS NOT NULL, expires_at + INTERVAL keep_tombstone MICROSECOND, expires_at))`
	// uncertain: an in-progress row whose lease lapsed under a keep that
	// has not ended.
	uncertain = `state = 1 AND ends_at <= ` + now + ` AND expires_at > ` + now + ` AND keep_uncertain IS NOT NULL`
	// freeTombstone turns a completed row past its response's end, kept as a
	// tombstone, into one: state 4, response and token dropped, expires_at
	// moved to the keep's end (assigned before keep_tombstone is cleared).
	freeTombstone = `SET state = 4, response = NULL, token = '', steps = NULL, retain = NULL, expires_at = expires_at + INTERVAL keep_tombstone MICROSECOND, keep_tombstone = NULL`
	// tombstoneDue: a completed row kept as a tombstone whose response's end passed.
	tombstoneDue = `state = 2 AND keep_tombstone IS NOT NULL AND expires_at <= ` + now
)

func newQueries(t, proc string) queries {
	// The owner's in-progress row, its lease live or, under a keep,
	// uncertain: expires_at is the keep's end for in-progress rows (or the
	// journal's retain, past the lease's end, ends_at).
	owned := "`key` = ? AND token = ? AND state = 1 AND expires_at > " + now + " AND (keep_uncertain IS NOT NULL OR IFNULL(ends_at, expires_at) > " + now + ")"
	// The token's in-progress row whose lease is live (not uncertain).
	leased := "`key` = ? AND token = ? AND state = 1 AND IFNULL(ends_at, expires_at) > " + now
	keys := "`key` IN (?" + strings.Repeat(", ?", PurgeBatch-1) + ")"
	return queries{
		// The zero Keep's CALL passes no more parameters than before keeps
		// existed (each costs the driver bytes on every acquire).
		acquire:     `CALL ` + proc + `(?, ?, ?, ?, 0, 0)`,
		acquireKeep: `CALL ` + proc + `(?, ?, ?, ?, ?, ?)`,
		// The keep_tombstone of the row stays: it is carried to the
		// completed record.
		complete: `UPDATE ` + t + ` SET state = 2, response = ?, ends_at = NULL, keep_uncertain = NULL, recovery = NULL, due_at = NULL, expires_at = ` + now +
			` + INTERVAL ? MICROSECOND WHERE ` + owned,
		release: `DELETE FROM ` + t + ` WHERE ` + owned,
		// The lease twice: for ends_at (kept only under an uncertain keep)
		// and for expires_at (the lease's end plus that keep).
		extend: `UPDATE ` + t + ` SET ends_at = IF(keep_uncertain IS NULL AND retain IS NULL, NULL, ` + now + ` + INTERVAL ? MICROSECOND), ` +
			`due_at = IF(due_at IS NULL, NULL, ends_at + INTERVAL IFNULL(backoff, 0) MICROSECOND), ` +
			`expires_at = ` + now + ` + INTERVAL ? + IFNULL(keep_uncertain, IFNULL(retain, 0)) MICROSECOND WHERE ` + owned,
		get: `SELECT ` + shown + `, token, fingerprint, response FROM ` + t + " WHERE `key` = ? AND " + live,
		completedBy: `SELECT EXISTS (SELECT 1 FROM ` + t +
			" WHERE `key` = ? AND token = ? AND state = 2 AND " + live + `)`,
		inspect: `SELECT ` + shown + `, token, fingerprint, response, TIMESTAMPDIFF(MICROSECOND, ` + now + `, ` + ttlAt + `) FROM ` +
			t + " WHERE `key` = ? AND " + live,
		// A tombstone shows no token (the purger drops it).
		evict: `DELETE FROM ` + t + " WHERE `key` = ? AND " + shown + ` = ? AND IF(state = 4 OR (state = 2 AND expires_at <= ` + now +
			`), '', token) = ? AND fingerprint = ? AND ` + live,
		// List's page: key prefix (LIKE 'hex%'), state (0: any), the
		// cursor's expiry (twice) and key, the limit. Tombstones are
		// never listed; in-progress rows are, lapsed or not.
		list: "SELECT `key`, " + shown + ", token, fingerprint, DATE_FORMAT(expires_at, '%Y-%m-%d %H:%i:%s.%f'), " +
			"TIMESTAMPDIFF(MICROSECOND, " + now + ", " + ttlAt + ") FROM " + t +
			" WHERE `key` LIKE ? AND (? = 0 OR " + shown + " = ?) AND (state = 1 OR (state = 2 AND expires_at > " + now + "))" +
			" AND (expires_at > ? OR (expires_at = ? AND `key` > ?)) ORDER BY expires_at, `key` LIMIT ?",
		resolveRelease: `DELETE FROM ` + t + " WHERE `key` = ? AND " + uncertain,
		// The journal's statements take the step's JSON path ($."name";
		// names are [A-Za-z0-9_:/-]) as their first parameter(s).
		// startStep sets ends_at (the lease's end) before expires_at moves
		// to it plus retain (MySQL assigns left to right), and adds the
		// entry unless it is there or the journal is full.
		startStep: `UPDATE ` + t + ` SET ends_at = IFNULL(ends_at, expires_at), retain = GREATEST(IFNULL(retain, 0), ?),
  expires_at = IF(keep_uncertain IS NOT NULL, expires_at, ends_at + INTERVAL retain MICROSECOND),
  steps = IF(JSON_CONTAINS_PATH(IFNULL(steps, '{}'), 'one', ?), steps,
    JSON_SET(IFNULL(steps, '{}'), ?, JSON_OBJECT('i', JSON_LENGTH(IFNULL(steps, '{}')), 't', CAST(? AS CHAR))))
WHERE ` + leased + ` AND (JSON_CONTAINS_PATH(IFNULL(steps, '{}'), 'one', ?) OR JSON_LENGTH(IFNULL(steps, '{}')) < ` + strconv.Itoa(idem.MaxSteps) + `)`,
		// stepOf reads, after startStep or finishStep, whether the token
		// still holds the lease, and the step's entry.
		stepOf: `SELECT IFNULL(` + leased + `, 0), JSON_UNQUOTE(JSON_EXTRACT(steps, CONCAT(?, '.t'))), JSON_UNQUOTE(JSON_EXTRACT(steps, CONCAT(?, '.r')))
FROM ` + t + " WHERE `key` = ?",
		finishStep: `UPDATE ` + t + ` SET steps = JSON_SET(steps, CONCAT(?, '.r'), TO_BASE64(?))
WHERE ` + leased + ` AND JSON_CONTAINS_PATH(IFNULL(steps, '{}'), 'one', ?) AND NOT JSON_CONTAINS_PATH(steps, 'one', CONCAT(?, '.r'))`,
		suspend: `UPDATE ` + t + ` SET ends_at = ` + now + `, keep_uncertain = ?, due_at = NULL, expires_at = ` + now + ` + INTERVAL keep_uncertain MICROSECOND WHERE ` + leased,
		steps:   `SELECT steps FROM ` + t + " WHERE `key` = ? AND " + live + ` AND state <> 4 AND NOT (state = 2 AND expires_at <= ` + now + `)`,
		// The token is dropped: the old owner's completion check must not
		// take the operator's response for its own commit.
		resolveComplete: `UPDATE ` + t + ` SET state = 2, response = ?, token = '', ends_at = NULL, keep_uncertain = NULL, recovery = NULL, due_at = NULL, expires_at = ` +
			now + " + INTERVAL ? MICROSECOND WHERE `key` = ? AND " + uncertain,
		// A plain (non-locking) read through the expires_at index, of the
		// rows due (expires_at is when the purger acts on a row: it deletes
		// it, or frees a tombstone's response), each with whether it is a
		// tombstone to free. The DELETE or UPDATE that follows locks only
		// the rows it changes, by primary key, so purging takes no gap
		// locks on the index under REPEATABLE READ.
		purgeSelect: "SELECT `key`, " + tombstoneDue + " FROM " + t + ` WHERE expires_at <= ` + now + ` ORDER BY expires_at LIMIT ?`,
		// PurgeBatch keys (NULL for none), and still due: a row taken
		// over since the read stays, and so does a tombstone to free.
		purgeDelete: "DELETE FROM " + t + " WHERE " + keys + " AND expires_at <= " + now + " AND (state <> 2 OR keep_tombstone IS NULL)",
		purgeFree:   "UPDATE " + t + " " + freeTombstone + " WHERE " + keys + " AND " + tombstoneDue,
	}
}

// stmt returns the prepared statement for query, preparing it on first
// use: database/sql then prepares it again on each pool connection it
// runs on, once, so every later call is one round trip whatever the DSN's
// interpolateParams.
func (s *Store) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	if st := s.stmts[query]; st != nil {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	s.stmts[query] = st
	return st, nil
}

// micros returns d in microseconds, rounded up (a 1ns lease is 1µs).
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

func checkIDs(ids ...string) error {
	for _, id := range ids {
		if len(id) > MaxIDLength {
			return fmt.Errorf("%w (%d bytes)", ErrInvalidID, len(id))
		}
	}
	return nil
}

func mysqlErrno(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// toRecord builds a record from a row and the state shown for it (see
// shown). A completed record's response is the row's own copy of the
// engine's bytes, handed out as they are; other states carry none, and a
// tombstone no token.
func toRecord(state int8, token, fp string, raw []byte) (idem.Record, error) {
	rec := idem.Record{Token: token, Fingerprint: fp}
	switch state {
	case stateInProgress:
		rec.State = idem.StateInProgress
	case stateCompleted:
		if len(raw) == 0 {
			return idem.Record{}, fmt.Errorf("%w: completed record without a response", ErrCorrupt)
		}
		rec.State, rec.Response = idem.StateCompleted, raw
	case stateUncertain:
		rec.State = idem.StateUncertain
	case stateExpired:
		rec.State, rec.Token = idem.StateExpired, ""
	default:
		return idem.Record{}, fmt.Errorf("%w: state %d", ErrCorrupt, state)
	}
	return rec, nil
}

// Acquire implements [idem.Store]: it is AcquireKeep with the zero
// [idem.Keep].
func (s *Store) Acquire(ctx context.Context, key, token, fingerprint string, lease time.Duration) (idem.Record, bool, error) {
	return s.AcquireKeep(ctx, key, token, fingerprint, lease, idem.Keep{})
}

// AcquireKeep implements [idem.Keeper]: one CALL of the table's acquire
// procedure (see [Store.SchemaSQL]), one round trip; an in-progress record
// comes with its [idem.Record.LeaseLeft]. A replay, a conflict, a mismatch,
// an uncertain record or a tombstone is answered from a plain read (a
// completed row found past its response's end under a tombstone keep is
// first turned into its tombstone, freeing the response); only a free or
// expired key is written, by an INSERT … ON DUPLICATE KEY UPDATE whose
// takeover condition InnoDB evaluates on the latest row version under the
// row's exclusive lock, so among racing takeovers exactly one wins. The
// record carries keep (in microseconds, rounded up) through Extend and
// Complete. Errors: [idem.ErrInvalidDuration] for lease <= 0 or a negative
// keep, [ErrInvalidID], [ErrContention], ctx's error, server errors wrapped.
func (s *Store) AcquireKeep(ctx context.Context, key, token, fingerprint string, lease time.Duration, keep idem.Keep) (idem.Record, bool, error) {
	if lease <= 0 || keep.Uncertain < 0 || keep.Tombstone < 0 {
		return idem.Record{}, false, idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	if err := checkIDs(key, token, fingerprint); err != nil {
		return idem.Record{}, false, err
	}
	query, args := s.q.acquire, []any{key, token, fingerprint, micros(lease)}
	if keep != (idem.Keep{}) {
		query, args = s.q.acquireKeep, append(args, micros(keep.Uncertain), micros(keep.Tombstone))
	}
	st, err := s.stmt(ctx, query)
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("mysqlstore: acquire: %w", err)
	}
	for range maxAcquireAttempts {
		var (
			state   int8
			tok, fp string
			raw     []byte
			leftUS  int64 // the time left until the record's state changes, by the server's clock
			prev    string
			prevUS  int64 // the time left on the lease taken over (<= 0)
		)
		err := st.QueryRowContext(ctx, args...).Scan(&state, &tok, &fp, &raw, &leftUS, &prev, &prevUS)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			continue // the record it saw was deleted or expired before its answer
		case mysqlErrno(err) == erLockDeadlock:
			continue // rolled back as a deadlock victim: nothing was written
		case err != nil:
			return idem.Record{}, false, fmt.Errorf("mysqlstore: acquire: %w", err)
		case tok == token && (state == stateInProgress || state == stateUncertain) && prev != "":
			// took a lapsed lease over
			return idem.Record{State: idem.StateInProgress, Token: prev, LeaseLeft: min(time.Duration(prevUS)*time.Microsecond, -1)}, true, nil
		case tok == token && (state == stateInProgress || state == stateUncertain):
			return idem.Record{}, true, nil // its own row (a very short lease may have lapsed already)
		}
		rec, err := toRecord(state, tok, fp, raw)
		if rec.State == idem.StateInProgress {
			rec.LeaseLeft = max(time.Duration(leftUS)*time.Microsecond, 1) // live: the lease's end was ahead
		}
		return rec, false, err
	}
	return idem.Record{}, false, ErrContention
}

// Complete implements [idem.Store]: one conditional UPDATE. The token is
// kept in the completed row (so a completion whose reply was lost can be
// recognised), and so is the row's tombstone keep ([idem.Keep.Tombstone]).
// The owner of an uncertain record may complete it.
func (s *Store) Complete(ctx context.Context, key, token string, response []byte, retention time.Duration) error {
	if retention <= 0 {
		return idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.complete(ctx, nil, key, token, response, retention)
}

// complete stores the engine's response bytes b, through tx when it is not nil.
func (s *Store) complete(ctx context.Context, tx *sql.Tx, key, token string, b []byte, retention time.Duration) error {
	if err := checkIDs(key, token); err != nil {
		return err
	}
	st, err := s.stmt(ctx, s.q.complete)
	if err != nil {
		return fmt.Errorf("mysqlstore: complete: %w", err)
	}
	if tx != nil {
		st = tx.StmtContext(ctx, st)
	}
	res, err := st.ExecContext(ctx, b, micros(retention), key, token)
	if err != nil {
		if tooLarge(err) {
			return fmt.Errorf("%w (%d bytes): %w", ErrTooLarge, len(b), err)
		}
		return fmt.Errorf("mysqlstore: complete: %w", err)
	}
	return ownedRow(res, "complete")
}

// tooLarge reports whether err refuses a statement as larger than
// max_allowed_packet: the driver's own check, MariaDB's
// ER_NET_PACKET_TOO_LARGE, or MySQL's message for a long parameter
// ("… longer than 'max_allowed_packet' bytes", reported as an unknown error).
func tooLarge(err error) bool {
	var me *mysql.MySQLError
	return errors.Is(err, mysql.ErrPktTooLarge) ||
		errors.As(err, &me) && (me.Number == erNetPacketLarge || strings.Contains(me.Message, "max_allowed_packet"))
}

// ownedRow turns a conditional statement's result into nil (one row
// matched) or [idem.ErrNotOwner]. The conditions name the owner, so the
// count is the same with and without the DSN's clientFoundRows.
func ownedRow(res sql.Result, op string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("mysqlstore: %s: %w", op, err)
	}
	if n == 0 {
		return idem.ErrNotOwner
	}
	return nil
}

// Release implements [idem.Store]: one conditional DELETE.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkIDs(key, token); err != nil {
		return err
	}
	st, err := s.stmt(ctx, s.q.release)
	if err != nil {
		return fmt.Errorf("mysqlstore: release: %w", err)
	}
	res, err := st.ExecContext(ctx, key, token)
	if err != nil {
		return fmt.Errorf("mysqlstore: release: %w", err)
	}
	return ownedRow(res, "release")
}

// Extend implements [idem.Extender]: one conditional UPDATE, keeping the
// record's keep ([idem.Keep.Uncertain] counts from the new lease's end).
// The owner of an uncertain record may extend it: it is in progress again.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if lease <= 0 {
		return idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkIDs(key, token); err != nil {
		return err
	}
	st, err := s.stmt(ctx, s.q.extend)
	if err != nil {
		return fmt.Errorf("mysqlstore: extend: %w", err)
	}
	us := micros(lease)
	res, err := st.ExecContext(ctx, us, us, key, token)
	if err != nil {
		return fmt.Errorf("mysqlstore: extend: %w", err)
	}
	return ownedRow(res, "extend")
}

// Get implements [idem.Store]: one SELECT of the live row, uncertain
// records and tombstones included (as in [idem.Keeper]).
func (s *Store) Get(ctx context.Context, key string) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	if err := checkIDs(key); err != nil {
		return idem.Record{}, false, err
	}
	st, err := s.stmt(ctx, s.q.get)
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("mysqlstore: get: %w", err)
	}
	var (
		state   int8
		tok, fp string
		raw     []byte
	)
	err = st.QueryRowContext(ctx, key).Scan(&state, &tok, &fp, &raw)
	if errors.Is(err, sql.ErrNoRows) {
		return idem.Record{}, false, nil
	}
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("mysqlstore: get: %w", err)
	}
	rec, err := toRecord(state, tok, fp, raw)
	return rec, err == nil, err
}

// Inspect implements [idem.Inspector]: one SELECT of the live row and its
// time to live by the server's clock (for an uncertain record or a
// tombstone, until its keep ends).
func (s *Store) Inspect(ctx context.Context, key string) (idem.RecordInfo, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.RecordInfo{}, false, err
	}
	if err := checkIDs(key); err != nil {
		return idem.RecordInfo{}, false, err
	}
	var (
		state   int8
		tok, fp string
		raw     []byte
		ttl     int64
	)
	err := s.db.QueryRowContext(ctx, s.q.inspect, key).Scan(&state, &tok, &fp, &raw, &ttl)
	if errors.Is(err, sql.ErrNoRows) {
		return idem.RecordInfo{}, false, nil
	}
	if err != nil {
		return idem.RecordInfo{}, false, fmt.Errorf("mysqlstore: inspect: %w", err)
	}
	rec, err := toRecord(state, tok, fp, raw)
	if err != nil {
		return idem.RecordInfo{}, false, err
	}
	return idem.RecordInfo{Record: rec, TTL: time.Duration(ttl) * time.Microsecond}, true, nil
}

// Evict implements [idem.Inspector]: one DELETE of the live row conditional
// on the state, owner token (none for a tombstone) and fingerprint of
// seen; [idem.ErrRecordChanged] when it matched none.
func (s *Store) Evict(ctx context.Context, key string, seen idem.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkIDs(key, seen.Token, seen.Fingerprint); err != nil {
		return err
	}
	res, err := s.db.ExecContext(ctx, s.q.evict, key, int8(seen.State), seen.Token, seen.Fingerprint)
	if err != nil {
		return fmt.Errorf("mysqlstore: evict: %w", err)
	}
	if err := ownedRow(res, "evict"); err != nil {
		if errors.Is(err, idem.ErrNotOwner) {
			return idem.ErrRecordChanged
		}
		return err
	}
	return nil
}

// Resolve implements [idem.Keeper]: one conditional statement on the
// uncertain row (an in-progress row whose lease lapsed under a keep that
// has not ended): a DELETE for a nil response, else an UPDATE completing
// it for retention (and its tombstone keep after it) without an owner
// token. [idem.ErrRecordChanged] when no uncertain row matched; a response
// above max_allowed_packet is [ErrTooLarge]; [idem.ErrInvalidDuration]
// for a response with retention <= 0.
func (s *Store) Resolve(ctx context.Context, key string, response []byte, retention time.Duration) error {
	if response != nil && retention <= 0 {
		return idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkIDs(key); err != nil {
		return err
	}
	var (
		res sql.Result
		err error
	)
	if response == nil {
		res, err = s.db.ExecContext(ctx, s.q.resolveRelease, key)
	} else {
		res, err = s.db.ExecContext(ctx, s.q.resolveComplete, response, micros(retention), key)
	}
	if err != nil {
		if tooLarge(err) {
			return fmt.Errorf("%w (%d bytes): %w", ErrTooLarge, len(response), err)
		}
		return fmt.Errorf("mysqlstore: resolve: %w", err)
	}
	if err := ownedRow(res, "resolve"); err != nil {
		if errors.Is(err, idem.ErrNotOwner) {
			return idem.ErrRecordChanged
		}
		return err
	}
	return nil
}

// completedBy reports whether key holds a live record completed by token.
func (s *Store) completedBy(ctx context.Context, key, token string) (bool, error) {
	var ok bool
	if err := s.db.QueryRowContext(ctx, s.q.completedBy, key, token).Scan(&ok); err != nil {
		return false, fmt.Errorf("mysqlstore: check completion: %w", err)
	}
	return ok, nil
}
