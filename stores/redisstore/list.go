package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
)

var _ idem.Lister = (*Store)(nil)

// listHead is how many bytes of a value List reads: enough for the state,
// token and fingerprint, not the response.
const listHead = 1024

// minScanCount is the least COUNT List gives SCAN: a prefix lookup walks
// the whole keyspace in batches this large, each one a short command.
const minScanCount = 1000

// maxScanCalls bounds the SCAN calls of one List call: a page that found
// fewer than Limit records after them ends with a cursor all the same, so
// that no call walks a large keyspace at once.
const maxScanCalls = 100

// List implements [idem.Lister] with SCAN (never KEYS): SCAN MATCH
// prefix+KeyPrefix* COUNT max(Limit, 1000), repeated until Limit records
// are found, the scan ends, or 100 SCAN calls were made (then the page
// holds fewer records, maybe none, and a cursor), and GETRANGE and PTTL of
// each key found, in one pipeline per batch. Every command is short, so
// the server is never blocked; a page may hold up to one batch more than
// Limit (a SCAN batch is returned whole), and, as SCAN guarantees, a
// record present for the whole listing is listed at least once across its
// pages. On a Cluster it scans each master in turn (ordered by address; a
// failover between pages may skip or repeat a node). Records come in scan
// order; an in-progress record whose lease lapsed is gone from Redis (the
// key expires with its lease) or, under [idem.Keep.Uncertain], listed as
// uncertain, so every TTL is > 0. Keys under the prefix
// that are not records are skipped, and so are tombstones and the response
// keys of records completed under a tombstone keep. The cursor is the node's index and
// SCAN's cursor.
func (s *Store) List(ctx context.Context, q idem.ListQuery) (idem.ListPage, error) {
	if err := q.Check(); err != nil {
		return idem.ListPage{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.ListPage{}, err
	}
	var node int
	var cursor uint64
	if q.Cursor != "" {
		n, c, ok := strings.Cut(q.Cursor, ":")
		var err1, err2 error
		node, err1 = strconv.Atoi(n)
		cursor, err2 = strconv.ParseUint(c, 10, 64)
		if !ok || err1 != nil || err2 != nil || node < 0 {
			return idem.ListPage{}, fmt.Errorf("redisstore: list: cursor %q was not returned by List", q.Cursor)
		}
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	nodes, err := s.nodes(ctx)
	if err != nil {
		return idem.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
	}
	if node >= len(nodes) {
		return idem.ListPage{}, fmt.Errorf("redisstore: list: cursor %q names a node the store does not have", q.Cursor)
	}
	match := globEscape(s.prefix) + q.KeyPrefix + "*"
	var page idem.ListPage
	for calls := 1; ; calls++ {
		keys, next, err := nodes[node].Scan(ctx, cursor, match, int64(max(q.Limit, minScanCount))).Result()
		if err != nil {
			return idem.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
		}
		recs, err := s.heads(ctx, keys, q.State)
		if err != nil {
			return idem.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
		}
		page.Records = append(page.Records, recs...)
		cursor = next
		if cursor == 0 {
			if node++; node == len(nodes) {
				return page, nil
			}
		}
		if len(page.Records) >= q.Limit || calls == maxScanCalls {
			page.Next = strconv.Itoa(node) + ":" + strconv.FormatUint(cursor, 10)
			return page, nil
		}
	}
}

// scanner is what List scans: one server.
type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// nodes returns the servers List scans: the client's one server, or a
// Cluster's masters ordered by address.
func (s *Store) nodes(ctx context.Context) ([]scanner, error) {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok {
		return []scanner{s.c}, nil
	}
	var (
		mu      sync.Mutex
		masters []*redis.Client
	)
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		masters = append(masters, c)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(masters, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
	nodes := make([]scanner, len(masters))
	for i, m := range masters {
		nodes[i] = m
	}
	return nodes, nil
}

// heads reads the state, token, fingerprint and TTL of the records at
// keys (full Redis keys), keeping those in state (0: any). Response keys,
// journal keys (see [Store.appendKeys], [Store.journalKeys]) and
// tombstones are skipped. A kept record's
// state comes from its TTL: a '3' value is uncertain once its PTTL is at
// most u, a '4' value a tombstone once its PTTL is at most t (its response
// key expired then).
func (s *Store) heads(ctx context.Context, keys []string, state idem.State) ([]idem.ListedRecord, error) {
	keys = slices.DeleteFunc(keys, func(k string) bool {
		k = k[min(len(s.prefix), len(k)):]
		return strings.Contains(k, respSuffix) || strings.Contains(k, journalSuffix)
	})
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := s.c.Pipeline()
	heads := make([]*redis.StringCmd, len(keys))
	ttls := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		heads[i] = pipe.GetRange(ctx, k, 0, listHead-1)
		ttls[i] = pipe.PTTL(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && !isWrongType(err) {
		return nil, err
	}
	var recs []idem.ListedRecord
	for i, k := range keys {
		v, err := heads[i].Result()
		ttl := ttls[i].Val().Milliseconds()
		if err != nil || v == "" || ttl <= 0 { // another type, or gone meanwhile
			continue
		}
		st, err := parseValue(v)
		if err != nil {
			continue
		}
		if st.rec.State == idem.StateCompleted && st.kept {
			if ttl <= st.t {
				continue // a tombstone
			}
			ttl -= st.t
		}
		rec, d := st.at(ttl, "", true, ttl)
		if state != 0 && rec.State != state {
			continue
		}
		recs = append(recs, idem.ListedRecord{Key: strings.TrimPrefix(k, s.prefix), RecordInfo: idem.RecordInfo{
			Record: idem.Record{State: rec.State, Token: strings.Clone(rec.Token), Fingerprint: strings.Clone(rec.Fingerprint)},
			TTL:    d,
		}})
	}
	return recs, nil
}

// globEscape escapes the characters SCAN MATCH patterns give a meaning.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
