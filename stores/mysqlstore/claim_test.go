package mysqlstore_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storetest"
)

// TestClaimRoundTrips: a recovery Claim costs 2 round trips when the
// record is due (its read, then its conditional takeover) and 1 when it is
// not; on one connection, its statements prepared by a first claim.
func TestClaimRoundTrips(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	db := newDB(t, countRoundTrips(&n))
	db.SetMaxOpenConns(1) // one connection: every statement prepared on it once
	s, _ := newStore(t, db)
	ctx := context.Background()
	keys := make([]string, 3)
	for i := range keys {
		keys[i] = storetest.Key()
		tok := storetest.Token()
		if _, ok, err := s.Acquire(ctx, keys[i], tok, "fp", time.Hour); err != nil || !ok {
			t.Fatalf("Acquire: %v, %v", ok, err)
		}
		if err := s.SetRecovery(ctx, keys[i], tok, []byte("payload"), time.Hour, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Extend(ctx, keys[i], tok, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		due, err := s.Lapsed(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(due) == len(keys) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Lapsed = %v; want the %d records due within 2 minutes", due, len(keys))
		}
	}
	claim := func(key string) bool {
		t.Helper()
		_, ok, err := s.Claim(ctx, key, storetest.Token(), time.Hour, 0)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !claim(keys[0]) { // prepares the statements
		t.Fatal("the first due record was not claimed")
	}
	var trips []int64
	for _, k := range keys[1:] {
		n.Store(0)
		if !claim(k) {
			t.Fatal("a due record was not claimed")
		}
		trips = append(trips, n.Load())
	}
	n.Store(0)
	if claim(keys[0]) {
		t.Fatal("a claimed record was claimed again")
	}
	trips = append(trips, n.Load())
	if !slices.Equal(trips, []int64{2, 2, 1}) {
		t.Fatalf("round trips of two claims of due records, then one of a claimed record = %v; want [2 2 1]", trips)
	}
}
