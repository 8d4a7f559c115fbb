package memstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
)

var _ idem.Inspector = (*Store)(nil)
var _ idem.Lister = (*Store)(nil)

// maxListScan bounds the records one List call reads: past it, the call
// ends its page after the current shard, with a Next.
const maxListScan = 1 << 14

// info returns the operator's view of the live entry e at now.
func (e *entry) info(now time.Time) idem.RecordInfo {
	state := e.stateAt(now)
	info := idem.RecordInfo{Record: idem.Record{State: state, Fingerprint: e.fp, Token: e.token}}
	switch state {
	case idem.StateInProgress, idem.StateCompleted:
		info.TTL = e.until.Sub(now) // <= 0: a lapsed lease kept for its journal
	default: // uncertain, tombstone: until the keep ends
		info.TTL = e.expires.Sub(now)
	}
	if state == idem.StateExpired {
		info.Token = ""
	}
	return info
}

// Inspect implements [idem.Inspector.Inspect]: the live record, an
// in-progress one whose lease lapsed and that is kept for its journal
// included (its TTL <= 0). A completed record's Response is a copy.
func (s *Store) Inspect(ctx context.Context, key string) (idem.RecordInfo, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.RecordInfo{}, false, err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e := sh.live(key, now)
	if e == nil {
		return idem.RecordInfo{}, false, nil
	}
	info := e.info(now)
	if info.State == idem.StateCompleted {
		info.Response = slices.Clone(e.resp)
	}
	return info, true, nil
}

// Evict implements [idem.Inspector.Evict].
func (s *Store) Evict(ctx context.Context, key string, seen idem.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e := sh.live(key, now)
	if e == nil {
		return idem.ErrRecordChanged
	}
	if info := e.info(now); info.State != seen.State || info.Token != seen.Token || e.fp != seen.Fingerprint {
		return idem.ErrRecordChanged
	}
	delete(sh.m, key)
	s.count.Add(-1)
	return nil
}

// List implements [idem.Lister.List]: records in shard order, by key
// within a shard; the cursor is "shard:last key". A call reads whole
// shards and stops after the one where the page fills, or after about
// 16,384 records read (then a page may hold fewer than Limit records).
func (s *Store) List(ctx context.Context, q idem.ListQuery) (idem.ListPage, error) {
	if err := q.Check(); err != nil {
		return idem.ListPage{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.ListPage{}, err
	}
	first, after, err := parseCursor(q.Cursor)
	if err != nil {
		return idem.ListPage{}, err
	}
	type candidate struct {
		key string
		e   *entry
	}
	var page idem.ListPage
	var found []candidate
	scanned := 0
	for i := first; i < numShards; i++ {
		sh := &s.shards[i]
		room := q.Limit - len(page.Records)
		sh.mu.Lock()
		now := s.now()
		scanned += len(sh.m)
		found = found[:0]
		for key, e := range sh.m {
			if !now.Before(e.expires) || !strings.HasPrefix(key, q.KeyPrefix) || (i == first && key <= after) {
				continue
			}
			if st := e.stateAt(now); st == idem.StateExpired || (q.State != 0 && st != q.State) {
				continue // tombstones are never listed
			}
			found = append(found, candidate{key, e})
		}
		slices.SortFunc(found, func(a, b candidate) int { return strings.Compare(a.key, b.key) })
		full := len(found) > room
		if full {
			found = found[:room]
		}
		for _, c := range found {
			page.Records = append(page.Records, idem.ListedRecord{Key: c.key, RecordInfo: c.e.info(now)})
		}
		sh.mu.Unlock()
		if full {
			page.Next = fmt.Sprintf("%d:%s", i, page.Records[len(page.Records)-1].Key)
			return page, nil
		}
		if i+1 < numShards && (len(page.Records) == q.Limit || scanned >= maxListScan) {
			page.Next = fmt.Sprintf("%d:", i+1)
			return page, nil
		}
	}
	return page, nil
}

// parseCursor reads a List cursor: "" or "shard:key".
func parseCursor(c string) (shard int, after string, err error) {
	if c == "" {
		return 0, "", nil
	}
	n, key, ok := strings.Cut(c, ":")
	i, err := strconv.Atoi(n)
	if !ok || err != nil || i < 0 || i >= numShards || len(key) > 64 || strings.Trim(key, "0123456789abcdef") != "" {
		return 0, "", errors.New("memstore: list: not a cursor of this store")
	}
	return i, key, nil
}
