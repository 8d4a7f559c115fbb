package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	idem "github.com/idemkit/idem/core"
)

var (
	_ idem.Inspector = (*Store)(nil)
	_ idem.Lister    = (*Store)(nil)
)

// ttl is a row r's time to live in microseconds by the clock n.t: until
// its lease or retention ends, or, for an uncertain record or a tombstone,
// until its keep ends ([idem.RecordInfo.TTL]).
const ttl = `(EXTRACT(EPOCH FROM CASE WHEN ` + phaseEnd + ` > n.t OR (r.state = 1 AND r.keep_uncertain IS NULL) THEN ` + phaseEnd + ` ELSE r.expires_at END - n.t) * 1000000)::bigint`

// Inspect implements [idem.Inspector]: one SELECT of the live row (uncertain
// records and tombstones included) and its time to live by the server's clock.
func (s *Store) Inspect(ctx context.Context, key string) (idem.RecordInfo, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.RecordInfo{}, false, err
	}
	var (
		state   int16
		tok, fp string
		raw     []byte
		us      int64
	)
	err := s.pool.QueryRow(ctx, `SELECT `+stateOf+`, `+tokenOf+`, r.fingerprint, `+responseOf+`, `+ttl+`
FROM `+s.table+` r, `+clock+` WHERE r.key = $1 AND r.expires_at > n.t`, key).Scan(&state, &tok, &fp, &raw, &us)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.RecordInfo{}, false, nil
	}
	if err != nil {
		return idem.RecordInfo{}, false, fmt.Errorf("pgstore: inspect: %w", err)
	}
	rec, err := toRecord(state, tok, fp, raw)
	if err != nil {
		return idem.RecordInfo{}, false, err
	}
	return idem.RecordInfo{Record: rec, TTL: time.Duration(us) * time.Microsecond}, true, nil
}

// Evict implements [idem.Inspector]: one DELETE of the live row conditional
// on the state (as Inspect derives it), owner token and fingerprint of
// seen; [idem.ErrRecordChanged] when it matched none.
func (s *Store) Evict(ctx context.Context, key string, seen idem.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.table+` r USING `+clock+`
WHERE r.key = $1 AND `+stateOf+` = $2 AND `+tokenOf+` = $3 AND r.fingerprint = $4 AND r.expires_at > n.t`,
		key, int16(seen.State), seen.Token, seen.Fingerprint)
	if err != nil {
		return fmt.Errorf("pgstore: evict: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrRecordChanged
	}
	return nil
}

// List implements [idem.Lister]: one SELECT ordered by (expires_at, key),
// through the expires_at index, or the primary key's range for a key
// prefix (key >= prefix AND key < prefix || 'g': scoped keys are hex).
// In-progress rows whose lease lapsed are listed: as uncertain while
// their keep lasts ([idem.Keep.Uncertain]), then (or without a keep) as
// in progress with TTL <= 0 until purged or taken over; completed rows
// past their retention (tombstones included) are not. Rows are ordered by
// expires_at, the end of the row (for a record with a keep, after it).
// The cursor is the last row's expires_at (Unix microseconds) and key.
func (s *Store) List(ctx context.Context, q idem.ListQuery) (idem.ListPage, error) {
	if err := q.Check(); err != nil {
		return idem.ListPage{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.ListPage{}, err
	}
	after, afterKey, err := parseCursor(q.Cursor)
	if err != nil {
		return idem.ListPage{}, err
	}
	rows, err := s.pool.Query(ctx, `SELECT r.key, `+stateOf+`, r.token, r.fingerprint, r.expires_at, `+ttl+`
FROM `+s.table+` r, `+clock+`
WHERE ($1 = '' OR (r.key >= $1 AND r.key < $1 || 'g' AND left(r.key, length($1)) = $1))
  AND ($2 = 0 OR `+stateOf+` = $2) AND (r.state = 1 OR `+phaseEnd+` > n.t)
  AND (r.expires_at, r.key) > ($3, $4)
ORDER BY r.expires_at, r.key LIMIT $5`, q.KeyPrefix, int16(q.State), after, afterKey, q.Limit)
	if err != nil {
		return idem.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
	}
	defer rows.Close()
	var (
		page idem.ListPage
		last time.Time
	)
	for rows.Next() {
		var (
			r     idem.ListedRecord
			state int16
			us    int64
		)
		if err := rows.Scan(&r.Key, &state, &r.Token, &r.Fingerprint, &last, &us); err != nil {
			return idem.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
		}
		r.State, r.TTL = idem.State(state), time.Duration(us)*time.Microsecond
		page.Records = append(page.Records, r)
	}
	if err := rows.Err(); err != nil {
		return idem.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
	}
	if len(page.Records) == q.Limit {
		page.Next = strconv.FormatInt(last.UnixMicro(), 10) + "," + page.Records[len(page.Records)-1].Key
	}
	return page, nil
}

// parseCursor reads a List cursor: the expiry and key of the last row
// returned; "" is the start.
func parseCursor(c string) (time.Time, string, error) {
	if c == "" {
		return time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), "", nil
	}
	us, key, ok := strings.Cut(c, ",")
	n, err := strconv.ParseInt(us, 10, 64)
	if !ok || err != nil {
		return time.Time{}, "", fmt.Errorf("pgstore: list: cursor %q was not returned by List", c)
	}
	return time.UnixMicro(n), key, nil
}
