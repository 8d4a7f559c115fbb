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

// ttl is a row's time to live in microseconds by the server's clock.
const ttl = `(EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000000)::bigint`

// Inspect implements [idem.Inspector]: one SELECT of the live row and its
// time to live by the server's clock.
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
	err := s.pool.QueryRow(ctx, `SELECT state, token, fingerprint, response, `+ttl+` FROM `+s.table+`
WHERE key = $1 AND expires_at > clock_timestamp()`, key).Scan(&state, &tok, &fp, &raw, &us)
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
// on the state, owner token and fingerprint of seen; [idem.ErrRecordChanged]
// when it matched none.
func (s *Store) Evict(ctx context.Context, key string, seen idem.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.table+`
WHERE key = $1 AND state = $2 AND token = $3 AND fingerprint = $4 AND expires_at > clock_timestamp()`,
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
// In-progress rows whose lease lapsed are listed (TTL <= 0) until purged
// or taken over; expired completed rows are not. The cursor is the last
// row's expiry (Unix microseconds) and key.
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
	rows, err := s.pool.Query(ctx, `SELECT key, state, token, fingerprint, expires_at, `+ttl+` FROM `+s.table+`
WHERE ($1 = '' OR (key >= $1 AND key < $1 || 'g' AND left(key, length($1)) = $1))
  AND ($2 = 0 OR state = $2) AND (state = 1 OR expires_at > clock_timestamp())
  AND (expires_at, key) > ($3, $4)
ORDER BY expires_at, key LIMIT $5`, q.KeyPrefix, int16(q.State), after, afterKey, q.Limit)
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
