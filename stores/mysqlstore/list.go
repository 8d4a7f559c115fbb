package mysqlstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
)

var _ idem.Lister = (*Store)(nil)

// List implements [idem.Lister]: one SELECT ordered by (expires_at, key),
// through the expires_at index, or the primary key's range for a key
// prefix (key LIKE 'prefix%'). In-progress rows whose lease lapsed are
// listed (TTL <= 0) until purged or taken over, as uncertain
// ([idem.StateUncertain], TTL until the keep ends) under
// [idem.Keep.Uncertain]; expired completed rows and tombstones are not.
// The cursor is the last row's expires_at (2006-01-02T15:04:05.000000)
// and key.
func (s *Store) List(ctx context.Context, q idem.ListQuery) (idem.ListPage, error) {
	if err := q.Check(); err != nil {
		return idem.ListPage{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.ListPage{}, err
	}
	after, afterKey := "0001-01-01 00:00:00.000000", ""
	if q.Cursor != "" {
		var ok bool
		if after, afterKey, ok = strings.Cut(q.Cursor, ","); !ok {
			return idem.ListPage{}, fmt.Errorf("mysqlstore: list: cursor %q was not returned by List", q.Cursor)
		}
		after = strings.Replace(after, "T", " ", 1)
		if _, err := time.Parse("2006-01-02 15:04:05.000000", after); err != nil {
			return idem.ListPage{}, fmt.Errorf("mysqlstore: list: cursor %q was not returned by List", q.Cursor)
		}
	}
	rows, err := s.db.QueryContext(ctx, s.q.list,
		q.KeyPrefix+"%", int8(q.State), int8(q.State), after, after, afterKey, q.Limit)
	if err != nil {
		return idem.ListPage{}, fmt.Errorf("mysqlstore: list: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var (
		page idem.ListPage
		last string
	)
	for rows.Next() {
		var (
			r     idem.ListedRecord
			state int8
			us    int64
		)
		if err := rows.Scan(&r.Key, &state, &r.Token, &r.Fingerprint, &last, &us); err != nil {
			return idem.ListPage{}, fmt.Errorf("mysqlstore: list: %w", err)
		}
		r.State, r.TTL = idem.State(state), time.Duration(us)*time.Microsecond
		page.Records = append(page.Records, r)
	}
	if err := rows.Err(); err != nil {
		return idem.ListPage{}, fmt.Errorf("mysqlstore: list: %w", err)
	}
	if len(page.Records) == q.Limit {
		page.Next = strings.Replace(last, " ", "T", 1) + "," + page.Records[len(page.Records)-1].Key
	}
	return page, nil
}
