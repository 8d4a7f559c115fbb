// Package storetest is the conformance suite every [idem.Store] must pass,
// shaped like testing/slogtest: one call from the store's own tests,
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) idem.Store { return newStore(t) })
//	}
//
// It checks the contract documented on [idem.Store] against the real store:
// acquire on absent, in-progress, completed and lapsed records (and the
// optional [idem.Record.LeaseLeft] of an in-progress one); exactly one
// winner among racing goroutines; owner-only complete, release and extend;
// lease and retention expiry (with real time, in tenths of a second);
// cancelled contexts; response bytes kept exactly (any byte, 1 MiB) and
// copied in and out; responses completed through an engine; the optional
// [idem.Extender], [idem.Inspector], [idem.Lister] and [idem.Keeper]
// (uncertain records, Resolve, tombstones) when the store has them.
// [RunDo] checks [idem.Do] on the store the same way; [RunJournal] and
// [RunRecovery] check the optional [idem.Journal], [idem.Recoverable] and
// [idem.StepResolver].
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// Durations used by the expiry tests: long enough for a store on a busy
// 2-core machine to answer well inside them, short enough to keep the suite fast.
const (
	shortLease = 300 * time.Millisecond
	longLease  = time.Minute
	retention  = time.Hour
)

// Run runs the conformance suite. newStore is called once per subtest and
// must return a store isolated from the others (e.g. by a random key prefix).
func Run(t *testing.T, newStore func(t *testing.T) idem.Store) {
	tests := []storeCase{
		{"AcquireAbsent", testAcquireAbsent},
		{"AcquireInProgress", testAcquireInProgress},
		{"LeaseLeft", testLeaseLeft},
		{"AcquireCompleted", testAcquireCompleted},
		{"AcquireLapsedLease", testAcquireLapsedLease},
		{"RacingAcquireOneWinner", testRacingAcquire},
		{"RacingTakeoverOneWinner", testRacingTakeover},
		{"CompleteOwnerOnly", testCompleteOwnerOnly},
		{"ReleaseOwnerOnly", testReleaseOwnerOnly},
		{"RetentionExpiry", testRetentionExpiry},
		{"RetentionNotExtendedByReplay", testRetentionNotExtended},
		{"LeaseExpiryGet", testLeaseExpiryGet},
		{"Extend", testExtend},
		{"CancelledContext", testCancelledContext},
		{"InvalidDurations", testInvalidDurations},
		{"BinaryRoundTrip", testBinaryRoundTrip},
		{"LargeBody", testLargeBody},
		{"DefensiveCopies", testDefensiveCopies},
		{"AcquiredBytesUnchanged", testAcquiredBytesUnchanged},
		{"Inspector", testInspector},
		{"Lister", testLister},
		{"CompleteThroughEngine", testCompleteThroughEngine},
		{"FingerprintWithID", testFingerprintWithID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newStore(t)) })
	}
	// The Keeper cases mostly wait for leases and retentions to lapse, each
	// on its own store: they wait together.
	keep := []storeCase{
		{"KeepUncertain", testKeepUncertain},
		{"UncertainOwner", testUncertainOwner},
		{"Resolve", testResolve},
		{"Tombstone", testTombstone},
		{"KeepTransitions", testKeepTransitions},
		{"KeepInspector", testKeepInspector},
	}
	t.Run("Keeper", func(t *testing.T) {
		for _, tt := range keep {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				tt.fn(t, newStore(t))
			})
		}
	})
}

// storeCase is one case of a suite, run on a store of its own.
type storeCase struct {
	name string
	fn   func(*testing.T, idem.Store)
}

// Key returns a fresh random key shaped like the engine's (64 hex characters).
func Key() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Token returns a fresh random owner token.
func Token() string { return rand.Text() }

func fingerprint(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// sampleResponse returns a response as a store receives it: opaque bytes
// (here an engine's encoding of a 201 with three header names).
func sampleResponse() []byte {
	return []byte("\x01\xc9\x01\x03\x0cContent-Type\x01\x10application/json" +
		"\x04Link\x02\x1a<a>; rel=\"x\", <b>; rel=\"y\"\x0c<c>; rel=\"z\"" +
		"\x08Location\x01\x12/v1/payments/pay_1" + `{"id":"pay_1"}`)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustAcquire(t *testing.T, s idem.Store, key, token, fp string, lease time.Duration) {
	t.Helper()
	rec, ok, err := s.Acquire(ctx(t), key, token, fp, lease)
	if err != nil || !ok {
		t.Fatalf("Acquire(%s) on a free key = %+v, %v, %v; want acquired", key[:8], rec, ok, err)
	}
}

func mustComplete(t *testing.T, s idem.Store, key, token string, resp []byte, ret time.Duration) {
	t.Helper()
	if err := s.Complete(ctx(t), key, token, resp, ret); err != nil {
		t.Fatalf("Complete by the owner: %v", err)
	}
}

func get(t *testing.T, s idem.Store, key string) (idem.Record, bool) {
	t.Helper()
	rec, found, err := s.Get(ctx(t), key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return rec, found
}

// equalResponse fails unless got holds exactly the bytes of want.
func equalResponse(t *testing.T, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("response = %q (%d bytes)\nwant       %q (%d bytes)", trunc(got), len(got), trunc(want), len(want))
	}
}

func trunc(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

func testAcquireAbsent(t *testing.T, s idem.Store) {
	key, tok, fp := Key(), Token(), fingerprint("a")
	if _, found := get(t, s, key); found {
		t.Fatal("Get on a fresh key: found")
	}
	mustAcquire(t, s, key, tok, fp, longLease)
	rec, found := get(t, s, key)
	if !found || rec.State != idem.StateInProgress || rec.Fingerprint != fp || rec.Token != tok || rec.Response != nil {
		t.Fatalf("Get after Acquire = %+v, %v; want in-progress, fingerprint and token kept", rec, found)
	}
}

func testAcquireInProgress(t *testing.T, s idem.Store) {
	key, tok, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, tok, fp, longLease)
	rec, ok, err := s.Acquire(ctx(t), key, Token(), fingerprint("other"), longLease)
	if err != nil || ok {
		t.Fatalf("second Acquire = %v, %v; want not acquired", ok, err)
	}
	if rec.State != idem.StateInProgress || rec.Fingerprint != fp || rec.Token != tok || rec.Response != nil {
		t.Fatalf("second Acquire returned %+v; want the first request's in-progress record", rec)
	}
	// The rejected request must not have disturbed the record.
	if err := s.Complete(ctx(t), key, tok, sampleResponse(), retention); err != nil {
		t.Fatalf("owner Complete after a rejected duplicate: %v", err)
	}
}

// testLeaseLeft checks [idem.Record.LeaseLeft] when the store fills it:
// the time left on an in-progress record's lease, within (0, lease],
// following a renewal ([idem.Extender]), and 0 on a completed record. A
// store reporting 0 on in-progress records does not fill it (optional).
func testLeaseLeft(t *testing.T, s idem.Store) {
	key, tok, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, tok, fp, longLease)
	rec, ok, err := s.Acquire(ctx(t), key, Token(), fp, longLease)
	if err != nil || ok {
		t.Fatalf("second Acquire = %v, %v; want not acquired", ok, err)
	}
	if rec.LeaseLeft == 0 {
		t.Log("the store does not report LeaseLeft")
		return
	}
	// The record was read within seconds of the Acquire, so most of the lease is left.
	if rec.LeaseLeft < longLease/2 || rec.LeaseLeft > longLease {
		t.Fatalf("LeaseLeft %v right after acquiring a %v lease; want within (%v, %v]", rec.LeaseLeft, longLease, longLease/2, longLease)
	}
	if ext, ok := s.(idem.Extender); ok {
		if err := ext.Extend(ctx(t), key, tok, 10*longLease); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		rec, _, err = s.Acquire(ctx(t), key, Token(), fp, longLease)
		if err != nil || rec.LeaseLeft <= longLease || rec.LeaseLeft > 10*longLease {
			t.Fatalf("LeaseLeft %v (%v) after extending to %v; want within (%v, %v]", rec.LeaseLeft, err, 10*longLease, longLease, 10*longLease)
		}
	}
	mustComplete(t, s, key, tok, sampleResponse(), retention)
	rec, _, err = s.Acquire(ctx(t), key, Token(), fp, longLease)
	if err != nil || rec.State != idem.StateCompleted || rec.LeaseLeft != 0 {
		t.Fatalf("Acquire on completed: state %v LeaseLeft %v (%v); want completed, 0", rec.State, rec.LeaseLeft, err)
	}
}

func testAcquireCompleted(t *testing.T, s idem.Store) {
	key, tok, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, tok, fp, longLease)
	mustComplete(t, s, key, tok, sampleResponse(), retention)
	for i := 0; i < 2; i++ {
		rec, ok, err := s.Acquire(ctx(t), key, Token(), fp, longLease)
		if err != nil || ok {
			t.Fatalf("Acquire on completed = %v, %v; want not acquired", ok, err)
		}
		if rec.State != idem.StateCompleted || rec.Fingerprint != fp {
			t.Fatalf("Acquire on completed returned state %v fingerprint %q; want completed, %q", rec.State, rec.Fingerprint, fp)
		}
		equalResponse(t, rec.Response, sampleResponse())
	}
	rec, found := get(t, s, key)
	if !found || rec.State != idem.StateCompleted || rec.Fingerprint != fp {
		t.Fatalf("Get on completed = %+v, %v", rec, found)
	}
	equalResponse(t, rec.Response, sampleResponse())
}

func testAcquireLapsedLease(t *testing.T, s idem.Store) {
	key, first, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, first, fp, shortLease)
	time.Sleep(shortLease + 200*time.Millisecond)
	second := Token()
	mustAcquire(t, s, key, second, fingerprint("b"), longLease)
	if err := s.Complete(ctx(t), key, first, sampleResponse(), retention); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete by the lapsed owner = %v; want ErrNotOwner", err)
	}
	if err := s.Release(ctx(t), key, first); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Release by the lapsed owner = %v; want ErrNotOwner", err)
	}
	rec, found := get(t, s, key)
	if !found || rec.Token != second || rec.Fingerprint != fingerprint("b") || rec.State != idem.StateInProgress {
		t.Fatalf("after takeover Get = %+v, %v; want the new owner's record", rec, found)
	}
	mustComplete(t, s, key, second, sampleResponse(), retention)
}

func testRacingAcquire(t *testing.T, s idem.Store) {
	const keys, racers = 8, 64
	for k := 0; k < keys; k++ {
		key := Key()
		var winners atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := 0; g < racers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				rec, ok, err := s.Acquire(context.Background(), key, Token(), fingerprint("a"), longLease)
				if err != nil {
					t.Errorf("racing Acquire: %v", err)
					return
				}
				if ok {
					winners.Add(1)
				} else if rec.State != idem.StateInProgress {
					t.Errorf("losing Acquire saw state %v; want in-progress", rec.State)
				}
			}()
		}
		close(start)
		wg.Wait()
		if n := winners.Load(); n != 1 {
			t.Fatalf("key %d: %d of %d racing Acquire calls won; want exactly 1", k, n, racers)
		}
	}
}

// testRacingTakeover races many requests taking over one expired record,
// for several keys at once and several rounds: a lapsed lease and a
// completed record past its retention. Exactly one request per key may win,
// whatever the interleaving; the losers must see the winner's live record,
// and only the winner may complete. The stores' atomicity is the only
// thing decided here: the racers start together and wait for nothing.
func testRacingTakeover(t *testing.T, s idem.Store) {
	const rounds, keys, racers = 3, 4, 24
	for round := range rounds {
		type lapsed struct{ key, owner string }
		var ks []lapsed
		for k := range keys {
			key, owner := Key(), Token()
			if k%2 == 0 { // in-progress, lease about to lapse
				mustAcquire(t, s, key, owner, fingerprint("a"), shortLease)
			} else { // completed, retention about to end
				mustAcquire(t, s, key, owner, fingerprint("a"), longLease)
				mustComplete(t, s, key, owner, sampleResponse(), shortLease)
			}
			ks = append(ks, lapsed{key, owner})
		}
		time.Sleep(shortLease + 200*time.Millisecond)

		winners := make([][]string, keys)
		seen := make([][]string, keys) // tokens the losers were shown
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for k, l := range ks {
			for range racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tok := Token()
					<-start
					rec, ok, err := s.Acquire(context.Background(), l.key, tok, fingerprint("b"), longLease)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err != nil:
						t.Errorf("racing takeover: %v", err)
					case ok:
						winners[k] = append(winners[k], tok)
					case rec.State != idem.StateInProgress || rec.Fingerprint != fingerprint("b"):
						t.Errorf("losing takeover saw %v with fingerprint %.8s; want the winner's in-progress record", rec.State, rec.Fingerprint)
					default:
						seen[k] = append(seen[k], rec.Token)
					}
				}()
			}
		}
		close(start)
		wg.Wait()
		for k, l := range ks {
			if len(winners[k]) != 1 {
				t.Fatalf("round %d key %d: %d of %d racing takeovers of one expired record won; want exactly 1", round, k, len(winners[k]), racers)
			}
			w := winners[k][0]
			for _, tok := range seen[k] {
				if tok != w {
					t.Fatalf("round %d key %d: a loser was shown token %.8s; want the winner's %.8s", round, k, tok, w)
				}
			}
			if err := s.Complete(ctx(t), l.key, l.owner, sampleResponse(), retention); !errors.Is(err, idem.ErrNotOwner) {
				t.Fatalf("Complete by the expired owner after the takeover = %v; want ErrNotOwner", err)
			}
			if rec, found := get(t, s, l.key); !found || rec.State != idem.StateInProgress || rec.Token != w {
				t.Fatalf("Get after the takeovers = %+v, %v; want the winner's in-progress record", rec, found)
			}
			mustComplete(t, s, l.key, w, sampleResponse(), retention)
		}
	}
}

func testCompleteOwnerOnly(t *testing.T, s idem.Store) {
	key, tok, fp := Key(), Token(), fingerprint("a")
	if err := s.Complete(ctx(t), key, tok, sampleResponse(), retention); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete on an absent key = %v; want ErrNotOwner", err)
	}
	if _, found := get(t, s, key); found {
		t.Fatal("Complete on an absent key created a record")
	}
	mustAcquire(t, s, key, tok, fp, longLease)
	if err := s.Complete(ctx(t), key, Token(), sampleResponse(), retention); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete by another token = %v; want ErrNotOwner", err)
	}
	if rec, _ := get(t, s, key); rec.State != idem.StateInProgress {
		t.Fatalf("Complete by another token changed the state to %v", rec.State)
	}
	mustComplete(t, s, key, tok, sampleResponse(), retention)
	other := []byte("another response")
	if err := s.Complete(ctx(t), key, tok, other, retention); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("second Complete = %v; want ErrNotOwner", err)
	}
	rec, _ := get(t, s, key)
	equalResponse(t, rec.Response, sampleResponse())
	if rec.Fingerprint != fp {
		t.Fatalf("Complete lost the fingerprint: %q", rec.Fingerprint)
	}
}

func testReleaseOwnerOnly(t *testing.T, s idem.Store) {
	key, tok, fp := Key(), Token(), fingerprint("a")
	if err := s.Release(ctx(t), key, tok); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Release on an absent key = %v; want ErrNotOwner", err)
	}
	mustAcquire(t, s, key, tok, fp, longLease)
	if err := s.Release(ctx(t), key, Token()); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Release by another token = %v; want ErrNotOwner", err)
	}
	if _, found := get(t, s, key); !found {
		t.Fatal("Release by another token deleted the record")
	}
	if err := s.Release(ctx(t), key, tok); err != nil {
		t.Fatalf("Release by the owner: %v", err)
	}
	if _, found := get(t, s, key); found {
		t.Fatal("record still there after the owner released it")
	}
	// Released keys execute again.
	tok2 := Token()
	mustAcquire(t, s, key, tok2, fp, longLease)
	mustComplete(t, s, key, tok2, sampleResponse(), retention)
	if err := s.Release(ctx(t), key, tok2); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Release of a completed record = %v; want ErrNotOwner", err)
	}
	if rec, found := get(t, s, key); !found || rec.State != idem.StateCompleted {
		t.Fatalf("Release deleted or changed a completed record: %+v, %v", rec, found)
	}
}

func testRetentionExpiry(t *testing.T, s idem.Store) {
	var key string
	timely(t, func() bool {
		var tok, fp string
		key, tok, fp = Key(), Token(), fingerprint("a")
		mustAcquire(t, s, key, tok, fp, longLease)
		start := time.Now() // the retention starts after this
		mustComplete(t, s, key, tok, sampleResponse(), shortLease)
		if _, found := get(t, s, key); !found {
			if time.Since(start) < shortLease {
				t.Fatal("completed record missing before its retention ended")
			}
			return false
		}
		return true
	})
	time.Sleep(shortLease + 200*time.Millisecond)
	if rec, found := get(t, s, key); found {
		t.Fatalf("Get after retention = %+v; want absent", rec)
	}
	mustAcquire(t, s, key, Token(), fingerprint("b"), longLease)
}

func testRetentionNotExtended(t *testing.T, s idem.Store) {
	var key string
	timely(t, func() bool {
		var tok, fp string
		key, tok, fp = Key(), Token(), fingerprint("a")
		mustAcquire(t, s, key, tok, fp, longLease)
		start := time.Now()
		mustComplete(t, s, key, tok, sampleResponse(), 2*shortLease)
		time.Sleep(shortLease)
		_, ok, err := s.Acquire(ctx(t), key, Token(), fp, longLease)
		_, found := get(t, s, key)
		if time.Since(start) >= 2*shortLease {
			return false // stalled past the retention: inconclusive
		}
		if err != nil || ok || !found {
			t.Fatalf("replay Acquire = %v, %v; Get found %v; want the completed record", ok, err, found)
		}
		return true
	})
	time.Sleep(shortLease + 200*time.Millisecond)
	if _, found := get(t, s, key); found {
		t.Fatal("a replay extended the retention")
	}
}

func testLeaseExpiryGet(t *testing.T, s idem.Store) {
	key, tok := Key(), Token()
	mustAcquire(t, s, key, tok, fingerprint("a"), shortLease)
	time.Sleep(shortLease + 200*time.Millisecond)
	if rec, found := get(t, s, key); found {
		t.Fatalf("Get after the lease lapsed = %+v; want absent", rec)
	}
	if err := s.Complete(ctx(t), key, tok, sampleResponse(), retention); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete after the lease lapsed = %v; want ErrNotOwner", err)
	}
}

func testExtend(t *testing.T, s idem.Store) {
	ext, ok := s.(idem.Extender)
	if !ok {
		t.Skip("store does not implement idem.Extender")
	}
	var key, tok string
	timely(t, func() bool {
		key, tok = Key(), Token()
		last := time.Now() // the lease runs from after this
		mustAcquire(t, s, key, tok, fingerprint("a"), shortLease)
		if err := ext.Extend(ctx(t), key, Token(), longLease); !errors.Is(err, idem.ErrNotOwner) {
			t.Fatalf("Extend by another token = %v; want ErrNotOwner", err)
		}
		for i := 0; i < 3; i++ {
			time.Sleep(shortLease / 2)
			start := time.Now()
			err := ext.Extend(ctx(t), key, tok, shortLease)
			if time.Since(last) >= shortLease {
				return false // stalled past the lease: inconclusive
			}
			if err != nil {
				t.Fatalf("Extend by the owner: %v", err)
			}
			last = start
		}
		// 1.5 leases have passed since Acquire: only the renewals kept it.
		_, ok, err := s.Acquire(ctx(t), key, Token(), fingerprint("a"), longLease)
		if time.Since(last) >= shortLease {
			return false
		}
		if err != nil || ok {
			t.Fatalf("Acquire while the owner keeps renewing = %v, %v; want not acquired", ok, err)
		}
		err = s.Complete(ctx(t), key, tok, sampleResponse(), retention)
		if time.Since(last) >= shortLease {
			return false
		}
		if err != nil {
			t.Fatalf("Complete by the renewing owner: %v", err)
		}
		return true
	})
	if err := ext.Extend(ctx(t), key, tok, longLease); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Extend of a completed record = %v; want ErrNotOwner", err)
	}
	key2, tok2 := Key(), Token()
	mustAcquire(t, s, key2, tok2, fingerprint("a"), shortLease)
	time.Sleep(shortLease + 200*time.Millisecond)
	if err := ext.Extend(ctx(t), key2, tok2, longLease); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Extend after the lease lapsed = %v; want ErrNotOwner", err)
	}
}

// timely runs try until a run's time-bound steps finished in time, at most
// 5 runs. Cases with a short lease or retention can only check what must
// still be live when the store answered before it lapsed; on a loaded
// machine a step may stall past it, which says nothing about the store, so
// try returns false for such an inconclusive run and fails the test only on
// a real fault.
func timely(t *testing.T, try func() bool) {
	t.Helper()
	// A loaded machine (make test-under-load) stalls many runs in a row:
	// try for two minutes, not a number of times.
	runs := 0
	for deadline := time.Now().Add(2 * time.Minute); runs < 5 || time.Now().Before(deadline); runs++ {
		if try() {
			return
		}
	}
	t.Fatalf("%d runs in 2 minutes stalled past a %v lease: the machine is too loaded to check this case", runs, shortLease)
}

func testCancelledContext(t *testing.T, s idem.Store) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	key, tok, fp := Key(), Token(), fingerprint("a")
	if _, _, err := s.Acquire(cancelled, key, tok, fp, longLease); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context = %v; want context.Canceled", err)
	}
	if _, found := get(t, s, key); found {
		t.Fatal("Acquire with a cancelled context created a record")
	}
	mustAcquire(t, s, key, tok, fp, longLease)
	if err := s.Complete(cancelled, key, tok, sampleResponse(), retention); !errors.Is(err, context.Canceled) {
		t.Fatalf("Complete with a cancelled context = %v; want context.Canceled", err)
	}
	if err := s.Release(cancelled, key, tok); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with a cancelled context = %v; want context.Canceled", err)
	}
	if ext, ok := s.(idem.Extender); ok {
		if err := ext.Extend(cancelled, key, tok, longLease); !errors.Is(err, context.Canceled) {
			t.Fatalf("Extend with a cancelled context = %v; want context.Canceled", err)
		}
	}
	if _, _, err := s.Get(cancelled, key); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with a cancelled context = %v; want context.Canceled", err)
	}
	rec, found := get(t, s, key)
	if !found || rec.State != idem.StateInProgress || rec.Token != tok {
		t.Fatalf("calls with a cancelled context changed the record: %+v, %v", rec, found)
	}
}

func testInvalidDurations(t *testing.T, s idem.Store) {
	key, tok := Key(), Token()
	for _, d := range []time.Duration{0, -time.Second} {
		if _, _, err := s.Acquire(ctx(t), key, tok, fingerprint("a"), d); !errors.Is(err, idem.ErrInvalidDuration) {
			t.Fatalf("Acquire with lease %v = %v; want ErrInvalidDuration", d, err)
		}
	}
	mustAcquire(t, s, key, tok, fingerprint("a"), longLease)
	if err := s.Complete(ctx(t), key, tok, sampleResponse(), 0); !errors.Is(err, idem.ErrInvalidDuration) {
		t.Fatalf("Complete with retention 0 = %v; want ErrInvalidDuration", err)
	}
	if ext, ok := s.(idem.Extender); ok {
		if err := ext.Extend(ctx(t), key, tok, 0); !errors.Is(err, idem.ErrInvalidDuration) {
			t.Fatalf("Extend with lease 0 = %v; want ErrInvalidDuration", err)
		}
	}
	if rec, _ := get(t, s, key); rec.State != idem.StateInProgress {
		t.Fatalf("invalid calls changed the record: %+v", rec)
	}
}

// testBinaryRoundTrip: a response is kept byte for byte, whatever the
// bytes (every byte value, NUL, invalid UTF-8, a lone byte).
func testBinaryRoundTrip(t *testing.T, s idem.Store) {
	for _, want := range [][]byte{binaryBytes(1024), {0}, {0xff}, []byte("\x00\x00\r\n\xc3")} {
		key, tok := Key(), Token()
		mustAcquire(t, s, key, tok, fingerprint("a"), longLease)
		mustComplete(t, s, key, tok, want, retention)
		rec, _ := get(t, s, key)
		equalResponse(t, rec.Response, want)
		rec, _, err := s.Acquire(ctx(t), key, Token(), fingerprint("a"), longLease)
		if err != nil {
			t.Fatal(err)
		}
		equalResponse(t, rec.Response, want)
	}
}

// binaryBytes returns n bytes cycling through every byte value, then
// invalid UTF-8 and NUL bytes.
func binaryBytes(n int) []byte {
	b := make([]byte, 0, n+5)
	for i := range n {
		b = append(b, byte(i*7+i>>8))
	}
	return append(b, 0xff, 0xfe, 0, 0, 0xc3)
}

func testLargeBody(t *testing.T, s idem.Store) {
	want := binaryBytes(1 << 20)
	key, tok := Key(), Token()
	mustAcquire(t, s, key, tok, fingerprint("a"), longLease)
	mustComplete(t, s, key, tok, want, retention)
	rec, _, err := s.Acquire(ctx(t), key, Token(), fingerprint("a"), longLease)
	if err != nil {
		t.Fatal(err)
	}
	equalResponse(t, rec.Response, want)
}

// testDefensiveCopies: the store copies Complete's bytes in (the caller
// may reuse them at once) and Get's bytes out (the caller may modify them).
func testDefensiveCopies(t *testing.T, s idem.Store) {
	key, tok := Key(), Token()
	mustAcquire(t, s, key, tok, fingerprint("a"), longLease)
	in := sampleResponse()
	mustComplete(t, s, key, tok, in, retention)
	for i := range in {
		in[i] = 'X'
	}
	rec, _ := get(t, s, key)
	equalResponse(t, rec.Response, sampleResponse())
	for i := range rec.Response {
		rec.Response[i] = 'Y'
	}
	_ = append(rec.Response[:0], "appended"...)
	rec2, _ := get(t, s, key)
	equalResponse(t, rec2.Response, sampleResponse())
	rec3, _, err := s.Acquire(ctx(t), key, Token(), fingerprint("a"), longLease)
	if err != nil {
		t.Fatal(err)
	}
	equalResponse(t, rec3.Response, sampleResponse())
}
