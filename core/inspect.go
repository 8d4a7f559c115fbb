package idem

import (
	"context"
	"errors"
	"time"
)

// ErrRecordChanged is returned by [Inspector.Evict] when the record is no
// longer the one the operator inspected: it completed, changed owner,
// expired or was deleted meanwhile. Nothing is deleted.
var ErrRecordChanged = errors.New("idem: record changed since it was inspected")

// RecordInfo is an operator's view of a stored record, returned by an
// [Inspector] (store authors implement it; cmd/idemctl reads it).
type RecordInfo struct {
	Record
	// TTL is the time left, by the store's clock, until the lease (in
	// progress) or the retention (completed) ends and the record expires.
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
