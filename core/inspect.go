package idem

import (
	"context"
	"errors"
	"strings"
	"time"
)

// ErrRecordChanged is returned by [Inspector.Evict] when the record is no
// longer the one the operator inspected (it completed, changed owner,
// expired or was deleted meanwhile), and by [Keeper.Resolve] when the
// record is not uncertain. Nothing is changed.
var ErrRecordChanged = errors.New("idem: record changed since it was inspected")

// RecordInfo is an operator's view of a stored record, returned by an
// [Inspector] (store authors implement it; cmd/idemctl reads it).
type RecordInfo struct {
	Record
	// TTL is the time left, by the store's clock, until the lease (in
	// progress), the retention (completed) or the keep (uncertain,
	// expired: see [Keep]) ends: when the record changes state or expires.
	TTL time.Duration
}

// Inspector, for store authors, is implemented by stores that let an operator look a record up
// and evict it (cmd/idemctl: "my payment is stuck"). It is optional: the
// [Engine] never calls it. Keys are scoped keys ([ScopedKey]). core/storetest
// checks implementations.
type Inspector interface {
	// Inspect returns the live record for key with its time to live;
	// found = false when it is absent or expired. err is for system
	// failures only. A completed record's Response is a copy, as
	// [Store.Get]'s; [DecodeResponse] reads it.
	Inspect(ctx context.Context, key string) (info RecordInfo, found bool, err error)

	// Evict deletes the live record for key in one atomic operation if it
	// still has the state, owner token and fingerprint of seen (as returned
	// by Inspect), and returns [ErrRecordChanged] otherwise, so that a
	// record that completed after it was inspected is never evicted by
	// mistake. After eviction a retry with the key executes again: evict an
	// in-progress record only when its handler is known not to run (a
	// renewed lease means it still runs), and a completed one only when the
	// client must be able to repeat the request.
	Evict(ctx context.Context, key string, seen Record) error
}

// ListQuery selects the records a [Lister] returns.
type ListQuery struct {
	// KeyPrefix keeps the records whose scoped key starts with it: lowercase
	// hex, e.g. the 16 characters idem's log lines carry as key=. Empty
	// keeps every key.
	KeyPrefix string
	// State keeps the records in that state; 0 keeps every listed state.
	State State
	// Limit bounds the page: > 0. A store may return a few more records
	// than Limit when it cannot stop within a batch (Redis SCAN).
	Limit int
	// Cursor is "" for the first page, else the Next of the previous page.
	Cursor string
}

// ListedRecord is one record of a [ListPage].
type ListedRecord struct {
	// Key is the record's scoped key (64 hex characters).
	Key string
	// RecordInfo is the record without its Response (nil; Inspect reads
	// it). A TTL <= 0 is an in-progress record whose lease lapsed and that
	// the store keeps until it is purged or taken over: its holder stopped
	// renewing it (crashed), and the next request with the key executes
	// (under [Keep.Uncertain] such a record is listed as [StateUncertain]).
	RecordInfo
}

// ListPage is one page of a [Lister]'s answer.
type ListPage struct {
	// Records are the records found, in the store's order: by expiry,
	// soonest first, in stores that index it (SQL, MongoDB), so stuck
	// leases and the oldest completed records come first; in scan order in
	// Redis.
	Records []ListedRecord
	// Next is the cursor of the next page, "" when the listing is done. A
	// page may hold fewer than Limit records, even none, and a Next: a
	// store may end a page after a bounded amount of work (Redis, after a
	// bounded number of SCAN calls).
	Next string
}

// Lister, for store authors, is implemented by stores that let an operator
// find records without knowing their full scoped key: by the key prefix of
// a log line, or all in-progress and oldest records in an incident
// (cmd/idemctl list). It is optional: the [Engine] never calls it. Each
// call is bounded by its Limit and never blocks the store: an indexed range
// scan in SQL and MongoDB, SCAN with COUNT in Redis (never KEYS). Completed
// records whose retention ended are never listed, tombstones included;
// uncertain records ([StateUncertain]) are listed as their own state.
type Lister interface {
	// List returns one page of the records matching q, and the cursor of
	// the next. An invalid query (Limit <= 0, KeyPrefix not lowercase hex,
	// a cursor this store did not return) is an error. err is otherwise
	// for system failures only.
	List(ctx context.Context, q ListQuery) (ListPage, error)
}

// Check returns an error when q is not a valid query: Limit <= 0, a
// KeyPrefix longer than 64 characters or not lowercase hex, or a State
// other than 0, [StateInProgress], [StateCompleted] and [StateUncertain]. [Lister]
// implementations call it first.
func (q ListQuery) Check() error {
	switch {
	case q.Limit <= 0:
		return errors.New("idem: list: limit must be > 0")
	case len(q.KeyPrefix) > 64 || strings.Trim(q.KeyPrefix, "0123456789abcdef") != "":
		return errors.New("idem: list: key prefix must be up to 64 lowercase hex characters")
	case q.State != 0 && q.State != StateInProgress && q.State != StateCompleted && q.State != StateUncertain:
		return errors.New("idem: list: unknown state")
	}
	return nil
}
