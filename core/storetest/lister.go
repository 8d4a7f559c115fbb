package storetest

import (
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// testLister checks the optional [idem.Lister]: invalid queries are
// refused; a key prefix keeps exactly the records whose key starts with
// it, a state only the records in it; records come without their
// response; pages of one record walk every record through the cursors
// and end; a completed record whose retention ended is not listed.
func testLister(t *testing.T, s idem.Store) {
	ls, ok := s.(idem.Lister)
	if !ok {
		t.Skip("store does not implement idem.Lister")
	}
	for _, q := range []idem.ListQuery{{}, {Limit: 1, KeyPrefix: "ABC"}, {Limit: 1, KeyPrefix: "xyz"}, {Limit: 1, State: 9}, {Limit: 1, Cursor: "not a cursor!"}} {
		if _, err := ls.List(ctx(t), q); err == nil {
			t.Errorf("List(%+v): no error", q)
		}
	}
	// all walks every page of q and returns the records by key.
	all := func(q idem.ListQuery) map[string]idem.ListedRecord {
		t.Helper()
		got := map[string]idem.ListedRecord{}
		for range 1000 { // a hang guard: a shared Redis may hold millions of other keys
			page, err := ls.List(ctx(t), q)
			if err != nil {
				t.Fatalf("List(%+v): %v", q, err)
			}
			for _, r := range page.Records {
				if r.Response != nil {
					t.Fatalf("List returned %s with its response", r.Key)
				}
				got[r.Key] = r
			}
			if page.Next == "" {
				return got
			}
			q.Cursor = page.Next
		}
		t.Fatalf("List(%+v): still a next page after 1000", q)
		return nil
	}
	if got := all(idem.ListQuery{Limit: 10}); len(got) != 0 {
		t.Fatalf("List of an empty store = %v", got)
	}

	prefix := Key()[:16]
	held, done, other := prefix+Key()[16:], prefix+Key()[16:], Key()
	fp := fingerprint("a")
	mustAcquire(t, s, held, "tok-held", fp, longLease)
	mustAcquire(t, s, done, "tok-done", fp, longLease)
	mustComplete(t, s, done, "tok-done", sampleResponse(), longLease)
	mustAcquire(t, s, other, "tok-other", fp, longLease)

	got := all(idem.ListQuery{KeyPrefix: prefix, Limit: 10})
	if len(got) != 2 || got[held].State != idem.StateInProgress || got[done].State != idem.StateCompleted {
		t.Fatalf("List by prefix %s = %+v; want %s in progress and %s completed", prefix, got, held, done)
	}
	if r := got[held]; r.Token != "tok-held" || r.Fingerprint != fp || r.TTL <= 0 || r.TTL > longLease {
		t.Fatalf("List: in-progress record = %+v; want its owner, fingerprint and lease left", r)
	}
	if r := got[done]; r.Fingerprint != fp || r.TTL <= 0 || r.TTL > longLease {
		t.Fatalf("List: completed record = %+v; want its fingerprint and retention left", r)
	}
	if got := all(idem.ListQuery{KeyPrefix: held, Limit: 10}); len(got) != 1 || got[held].Key != held {
		t.Fatalf("List by a whole key = %+v", got)
	}
	if got := all(idem.ListQuery{State: idem.StateInProgress, Limit: 10}); len(got) != 2 || got[held].Key == "" || got[other].Key == "" {
		t.Fatalf("List in progress = %+v; want %s and %s", got, held, other)
	}
	if got := all(idem.ListQuery{State: idem.StateCompleted, Limit: 1}); len(got) != 1 || got[done].Key == "" {
		t.Fatalf("List completed = %+v; want %s", got, done)
	}
	if got := all(idem.ListQuery{Limit: 1}); len(got) != 3 {
		t.Fatalf("List by pages of 1 = %+v; want the 3 records", got)
	}

	// A completed record whose retention ended is not listed.
	gone := Key()
	mustAcquire(t, s, gone, "tok-gone", fp, longLease)
	mustComplete(t, s, gone, "tok-gone", sampleResponse(), time.Millisecond)
	for deadline := time.Now().Add(2 * time.Minute); ; { // a hang guard
		if _, found := get(t, s, gone); !found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the completed record never expired")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := all(idem.ListQuery{KeyPrefix: gone, Limit: 10}); len(got) != 0 {
		t.Fatalf("List of an expired completed record = %+v", got)
	}
}
