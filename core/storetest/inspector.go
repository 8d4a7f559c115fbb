package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// testInspector checks the optional [idem.Inspector]: what Inspect shows of
// in-progress, completed and expired records, and that Evict deletes only
// the record that was inspected.
func testInspector(t *testing.T, s idem.Store) {
	in, ok := s.(idem.Inspector)
	if !ok {
		t.Skip("store does not implement idem.Inspector")
	}
	inspect := func(key string) (idem.RecordInfo, bool) {
		t.Helper()
		info, found, err := in.Inspect(ctx(t), key)
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		return info, found
	}
	key, tok, fp := Key(), Token(), fingerprint("a")
	if _, found := inspect(key); found {
		t.Fatal("Inspect of an absent key: found")
	}
	if err := in.Evict(ctx(t), key, idem.Record{State: idem.StateInProgress, Token: tok, Fingerprint: fp}); !errors.Is(err, idem.ErrRecordChanged) {
		t.Fatalf("Evict of an absent key = %v; want ErrRecordChanged", err)
	}

	// In progress: owner, fingerprint and lease left.
	mustAcquire(t, s, key, tok, fp, longLease)
	running, found := inspect(key)
	if !found || running.State != idem.StateInProgress || running.Token != tok || running.Fingerprint != fp || running.Response != nil {
		t.Fatalf("Inspect in progress = %+v, %v; want state, owner and fingerprint", running, found)
	}
	if running.TTL <= 0 || running.TTL > longLease {
		t.Fatalf("Inspect in progress: TTL %v, want in (0, %v]", running.TTL, longLease)
	}
	other := running.Record
	other.Token = Token()
	if err := in.Evict(ctx(t), key, other); !errors.Is(err, idem.ErrRecordChanged) {
		t.Fatalf("Evict with another owner = %v; want ErrRecordChanged", err)
	}

	// Completed since it was inspected: the stale view evicts nothing.
	mustComplete(t, s, key, tok, sampleResponse(), retention)
	if err := in.Evict(ctx(t), key, running.Record); !errors.Is(err, idem.ErrRecordChanged) {
		t.Fatalf("Evict of a record that completed since it was inspected = %v; want ErrRecordChanged", err)
	}
	done, found := inspect(key)
	if !found || done.State != idem.StateCompleted || done.Fingerprint != fp {
		t.Fatalf("Inspect completed = %+v, %v", done, found)
	}
	equalResponse(t, done.Response, sampleResponse())
	if done.TTL <= longLease || done.TTL > retention {
		t.Fatalf("Inspect completed: TTL %v, want the retention left, in (%v, %v]", done.TTL, longLease, retention)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := in.Inspect(cancelled, key); !errors.Is(err, context.Canceled) {
		t.Fatalf("Inspect with a cancelled context = %v; want context.Canceled", err)
	}
	if err := in.Evict(cancelled, key, done.Record); !errors.Is(err, context.Canceled) {
		t.Fatalf("Evict with a cancelled context = %v; want context.Canceled", err)
	}
	if err := in.Evict(ctx(t), key, done.Record); err != nil {
		t.Fatalf("Evict of the inspected completed record: %v", err)
	}
	if _, found := inspect(key); found {
		t.Fatal("Inspect after Evict: found")
	}
	// The key is free again: a retry executes.
	mustAcquire(t, s, key, Token(), fp, longLease)
	stuck, _ := inspect(key)
	if err := in.Evict(ctx(t), key, stuck.Record); err != nil {
		t.Fatalf("Evict of the inspected in-progress record: %v", err)
	}
	mustAcquire(t, s, key, Token(), fp, longLease)

	// Expired records are absent.
	key2 := Key()
	mustAcquire(t, s, key2, tok, fp, shortLease)
	seen, _ := inspect(key2)
	time.Sleep(shortLease + 200*time.Millisecond)
	if _, found := inspect(key2); found {
		t.Fatal("Inspect of an expired record: found")
	}
	if err := in.Evict(ctx(t), key2, seen.Record); !errors.Is(err, idem.ErrRecordChanged) {
		t.Fatalf("Evict of an expired record = %v; want ErrRecordChanged", err)
	}
}
