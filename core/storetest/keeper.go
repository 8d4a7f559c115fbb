package storetest

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// keeper returns s as an [idem.Keeper], skipping the case when it is not one.
func keeper(t *testing.T, s idem.Store) idem.Keeper {
	t.Helper()
	k, ok := s.(idem.Keeper)
	if !ok {
		t.Skip("store does not implement idem.Keeper")
	}
	return k
}

// acquireKeep acquires key under keep and fails unless it was free.
func acquireKeep(t *testing.T, k idem.Keeper, key, token, fp string, lease time.Duration, keep idem.Keep) {
	t.Helper()
	rec, ok, err := k.AcquireKeep(ctx(t), key, token, fp, lease, keep)
	if err != nil || !ok {
		t.Fatalf("AcquireKeep(%s) on a free key = %+v, %v, %v; want acquired", key[:8], rec, ok, err)
	}
}

// uncertainKey returns a key whose record, acquired by token under
// Keep.Uncertain = keepFor with a short lease, is uncertain: its lease lapsed.
func uncertainKey(t *testing.T, k idem.Keeper, token, fp string, keepFor time.Duration) string {
	t.Helper()
	key := Key()
	acquireKeep(t, k, key, token, fp, shortLease, idem.Keep{Uncertain: keepFor})
	time.Sleep(shortLease + 200*time.Millisecond)
	return key
}

// mustBeUncertain fails unless acquiring key answers its uncertain record,
// through both AcquireKeep and plain Acquire (the stored state rules).
func mustBeUncertain(t *testing.T, k idem.Keeper, key, owner, fp string) {
	t.Helper()
	for _, keep := range []idem.Keep{{Uncertain: longLease}, {}} {
		rec, ok, err := k.AcquireKeep(ctx(t), key, Token(), fp, longLease, keep)
		if err != nil || ok || rec.State != idem.StateUncertain || rec.Fingerprint != fp || rec.Token != owner || rec.Response != nil {
			t.Fatalf("AcquireKeep(keep %+v) of an uncertain record = %+v, %v, %v; want it unchanged, not acquired", keep, rec, ok, err)
		}
	}
	rec, ok, err := k.(idem.Store).Acquire(ctx(t), key, Token(), fingerprint("other"), longLease)
	if err != nil || ok || rec.State != idem.StateUncertain {
		t.Fatalf("Acquire with another fingerprint of an uncertain record = %+v, %v, %v; want it, not acquired", rec, ok, err)
	}
	got, found := get(t, k.(idem.Store), key)
	if !found || got.State != idem.StateUncertain || got.Token != owner || got.Fingerprint != fp {
		t.Fatalf("Get of an uncertain record = %+v, %v", got, found)
	}
}

// testKeepUncertain checks [idem.Keep.Uncertain]: a lapsed lease is not
// taken over, by any number of racing acquires, and the record expires when
// its keep ends.
func testKeepUncertain(t *testing.T, s idem.Store) {
	k := keeper(t, s)
	owner, fp := Token(), fingerprint("a")
	key := uncertainKey(t, k, owner, fp, longLease)
	mustBeUncertain(t, k, key, owner, fp)

	var wg sync.WaitGroup
	var won atomic.Int32
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, ok, err := k.AcquireKeep(ctx(t), key, Token(), fp, longLease, idem.Keep{}); err == nil && ok {
				won.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := won.Load(); n != 0 {
		t.Fatalf("%d racing acquires took an uncertain record over", n)
	}
	mustBeUncertain(t, k, key, owner, fp)

	// Its keep ends: the record expires and the key is free again.
	short := uncertainKey(t, k, Token(), fp, shortLease)
	time.Sleep(shortLease)
	mustAcquire(t, s, short, Token(), fp, longLease)
}

// testUncertainOwner checks that an uncertain record's own token still owns
// it (a holder that was slow, not dead): it may complete, release or extend
// it, and no other token may.
func testUncertainOwner(t *testing.T, s idem.Store) {
	k := keeper(t, s)
	ext, _ := s.(idem.Extender)
	owner, fp := Token(), fingerprint("a")
	key := uncertainKey(t, k, owner, fp, longLease)
	if err := s.Complete(ctx(t), key, Token(), sampleResponse(), retention); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete of an uncertain record by another token = %v; want ErrNotOwner", err)
	}
	if err := s.Release(ctx(t), key, Token()); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Release of an uncertain record by another token = %v; want ErrNotOwner", err)
	}
	if ext != nil {
		if err := ext.Extend(ctx(t), key, owner, longLease); err != nil {
			t.Fatalf("Extend of its uncertain record by the owner = %v", err)
		}
		if rec, _, err := k.AcquireKeep(ctx(t), key, Token(), fp, longLease, idem.Keep{}); err != nil || rec.State != idem.StateInProgress {
			t.Fatalf("after the owner extended it: Acquire = %+v, %v; want in progress", rec, err)
		}
	}
	mustComplete(t, s, key, owner, sampleResponse(), retention)
	rec, ok, err := s.Acquire(ctx(t), key, Token(), fp, longLease)
	if err != nil || ok || rec.State != idem.StateCompleted {
		t.Fatalf("after the owner completed it: Acquire = %+v, %v, %v; want completed", rec, ok, err)
	}
	equalResponse(t, rec.Response, sampleResponse())

	released := uncertainKey(t, k, owner, fp, longLease)
	if err := s.Release(ctx(t), released, owner); err != nil {
		t.Fatalf("Release of its uncertain record by the owner = %v", err)
	}
	mustAcquire(t, s, released, Token(), fp, longLease)
}

// testResolve checks [idem.Keeper.Resolve]: it releases or completes an
// uncertain record, and changes nothing else.
func testResolve(t *testing.T, s idem.Store) {
	k := keeper(t, s)
	owner, fp := Token(), fingerprint("a")

	released := uncertainKey(t, k, owner, fp, longLease)
	if err := k.Resolve(ctx(t), released, nil, 0); err != nil {
		t.Fatalf("Resolve(release) of an uncertain record = %v", err)
	}
	if rec, found := get(t, s, released); found {
		t.Fatalf("after Resolve(release): Get = %+v; want absent", rec)
	}
	mustAcquire(t, s, released, Token(), fp, longLease)

	completed := uncertainKey(t, k, owner, fp, longLease)
	if err := k.Resolve(ctx(t), completed, sampleResponse(), 0); !errors.Is(err, idem.ErrInvalidDuration) {
		t.Fatalf("Resolve(complete) with retention 0 = %v; want ErrInvalidDuration", err)
	}
	if err := k.Resolve(ctx(t), completed, sampleResponse(), retention); err != nil {
		t.Fatalf("Resolve(complete) of an uncertain record = %v", err)
	}
	rec, ok, err := s.Acquire(ctx(t), completed, Token(), fp, longLease)
	if err != nil || ok || rec.State != idem.StateCompleted || rec.Fingerprint != fp {
		t.Fatalf("after Resolve(complete): Acquire = %+v, %v, %v; want the completed record", rec, ok, err)
	}
	equalResponse(t, rec.Response, sampleResponse())
	if err := s.Complete(ctx(t), completed, owner, []byte("late"), retention); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete by the old owner after Resolve = %v; want ErrNotOwner", err)
	}

	// Nothing but an uncertain record is resolved.
	if err := k.Resolve(ctx(t), Key(), nil, 0); !errors.Is(err, idem.ErrRecordChanged) {
		t.Fatalf("Resolve of an absent key = %v; want ErrRecordChanged", err)
	}
	live, tok := Key(), Token()
	acquireKeep(t, k, live, tok, fp, longLease, idem.Keep{Uncertain: longLease})
	for _, resp := range [][]byte{nil, sampleResponse()} {
		if err := k.Resolve(ctx(t), live, resp, retention); !errors.Is(err, idem.ErrRecordChanged) {
			t.Fatalf("Resolve of a live lease = %v; want ErrRecordChanged", err)
		}
	}
	if rec, found := get(t, s, live); !found || rec.State != idem.StateInProgress || rec.Token != tok {
		t.Fatalf("Resolve changed a live lease: %+v, %v", rec, found)
	}
	mustComplete(t, s, live, tok, sampleResponse(), retention)
	if err := k.Resolve(ctx(t), live, nil, 0); !errors.Is(err, idem.ErrRecordChanged) {
		t.Fatalf("Resolve of a completed record = %v; want ErrRecordChanged", err)
	}
	if rec, found := get(t, s, live); !found || rec.State != idem.StateCompleted {
		t.Fatalf("Resolve changed a completed record: %+v, %v", rec, found)
	}
}

// testTombstone checks [idem.Keep.Tombstone]: after the retention the
// record answers as expired, with its fingerprint and no response, to any
// acquire; Resolve leaves it alone; it expires when its keep ends.
func testTombstone(t *testing.T, s idem.Store) {
	k := keeper(t, s)
	fp := fingerprint("a")
	var key string
	timely(t, func() bool {
		tok := Token()
		key = Key()
		acquireKeep(t, k, key, tok, fp, longLease, idem.Keep{Tombstone: longLease})
		start := time.Now()
		mustComplete(t, s, key, tok, sampleResponse(), shortLease)
		rec, ok, err := s.Acquire(ctx(t), key, Token(), fp, longLease)
		if time.Since(start) >= shortLease {
			return false // stalled past the retention: inconclusive
		}
		if err != nil || ok || rec.State != idem.StateCompleted {
			t.Fatalf("Acquire within the retention = %+v, %v, %v; want the completed record", rec, ok, err)
		}
		return true
	})
	time.Sleep(shortLease + 200*time.Millisecond)
	for _, f := range []string{fp, fingerprint("other")} {
		rec, ok, err := k.AcquireKeep(ctx(t), key, Token(), f, longLease, idem.Keep{})
		if err != nil || ok || rec.State != idem.StateExpired || rec.Fingerprint != fp || rec.Response != nil {
			t.Fatalf("Acquire of a tombstone = %+v, %v, %v; want expired with its fingerprint, no response, not acquired", rec, ok, err)
		}
	}
	if rec, found := get(t, s, key); !found || rec.State != idem.StateExpired || rec.Fingerprint != fp || rec.Response != nil {
		t.Fatalf("Get of a tombstone = %+v, %v", rec, found)
	}
	if err := k.Resolve(ctx(t), key, nil, 0); !errors.Is(err, idem.ErrRecordChanged) {
		t.Fatalf("Resolve of a tombstone = %v; want ErrRecordChanged", err)
	}

	// Its keep ends: the key is free again.
	short, tok := Key(), Token()
	acquireKeep(t, k, short, tok, fp, longLease, idem.Keep{Tombstone: shortLease})
	mustComplete(t, s, short, tok, sampleResponse(), shortLease)
	time.Sleep(2*shortLease + 200*time.Millisecond)
	mustAcquire(t, s, short, Token(), fp, longLease)
}

// testKeepTransitions checks that a record carries its Keep through
// Extend and through a completion by the unit of a [idem.Transactional]
// store, and that negative keeps are refused.
func testKeepTransitions(t *testing.T, s idem.Store) {
	k := keeper(t, s)
	fp := fingerprint("a")
	for _, keep := range []idem.Keep{{Uncertain: -time.Second}, {Tombstone: -time.Second}} {
		if _, _, err := k.AcquireKeep(ctx(t), Key(), Token(), fp, longLease, keep); !errors.Is(err, idem.ErrInvalidDuration) {
			t.Fatalf("AcquireKeep with keep %+v = %v; want ErrInvalidDuration", keep, err)
		}
	}
	if ext, ok := s.(idem.Extender); ok {
		key, tok := Key(), Token()
		acquireKeep(t, k, key, tok, fp, longLease, idem.Keep{Uncertain: longLease})
		if err := ext.Extend(ctx(t), key, tok, shortLease); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		time.Sleep(shortLease + 200*time.Millisecond)
		mustBeUncertain(t, k, key, tok, fp)
	}
	if tx, ok := s.(idem.Transactional); ok {
		key, tok := Key(), Token()
		acquireKeep(t, k, key, tok, fp, longLease, idem.Keep{Tombstone: longLease})
		if err := tx.Unit(key, tok).Complete(ctx(t), sampleResponse(), shortLease); err != nil {
			t.Fatalf("Unit.Complete: %v", err)
		}
		time.Sleep(shortLease + 200*time.Millisecond)
		if rec, ok, err := s.Acquire(ctx(t), key, Token(), fp, longLease); err != nil || ok || rec.State != idem.StateExpired {
			t.Fatalf("Acquire after a unit's completion under a tombstone keep = %+v, %v, %v; want expired", rec, ok, err)
		}
	}
}

// testKeepInspector checks what the optional [idem.Inspector] and
// [idem.Lister] show of uncertain records and tombstones.
func testKeepInspector(t *testing.T, s idem.Store) {
	k := keeper(t, s)
	owner, fp := Token(), fingerprint("a")
	key := uncertainKey(t, k, owner, fp, longLease)
	if in, ok := s.(idem.Inspector); ok {
		info, found, err := in.Inspect(ctx(t), key)
		if err != nil || !found || info.State != idem.StateUncertain || info.Token != owner || info.TTL <= 0 || info.TTL > longLease {
			t.Fatalf("Inspect of an uncertain record = %+v, %v, %v; want uncertain, its owner, TTL in (0, %v]", info, found, err, longLease)
		}
		if err := in.Evict(ctx(t), key, info.Record); err != nil {
			t.Fatalf("Evict of an uncertain record: %v", err)
		}
		mustAcquire(t, s, key, Token(), fp, longLease)
		key = uncertainKey(t, k, owner, fp, longLease)
	}
	ls, ok := s.(idem.Lister)
	if !ok {
		return
	}
	page, err := ls.List(ctx(t), idem.ListQuery{KeyPrefix: key, State: idem.StateUncertain, Limit: 10})
	if err != nil || len(page.Records) != 1 || page.Records[0].State != idem.StateUncertain {
		t.Fatalf("List(uncertain) = %+v, %v; want the uncertain record", page, err)
	}
	for _, st := range []idem.State{idem.StateInProgress, idem.StateCompleted} {
		if page, err := ls.List(ctx(t), idem.ListQuery{KeyPrefix: key, State: st, Limit: 10}); err != nil || len(page.Records) != 0 {
			t.Fatalf("List(%v) = %+v, %v; want no uncertain record", st, page, err)
		}
	}
}
