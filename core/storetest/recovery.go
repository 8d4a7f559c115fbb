package storetest

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// RunRecovery checks [idem.Recoverable] and [idem.StepResolver] on the store
// (which must also be an [idem.Journal], [idem.Keeper] and [idem.Extender]):
// SetRecovery fenced by the lease and its limits; a record with a payload
// kept past its lapse for its retain, reported by Lapsed once lapsed and no
// longer after Complete, Release, Suspend, Evict or its retain's end; Claim
// taking a due record over as a client's Acquire would (the new token owns
// it, the old one is fenced off, the journal and payload kept, attempts
// counted, the previous token reported, the backoff honoured after the
// claim's own lease lapses, the lease the one SetRecovery kept with the
// payload, not Claim's); an Acquire with another fingerprint answered a
// lapsed record with a payload unchanged; Claim refusing every record that
// is not due and leaving it unchanged, with exactly one winner among racing
// claims; Lapsed's hint property (a due record behind more than limit
// entries that are not due is returned once claims took them out of the
// way); ResolveStep on uncertain and lapsed records, then a takeover that
// resumes after the resolved step (a record in a claim's backoff due at
// once, its attempts counted from zero again), and [idem.ErrRecordChanged] for every
// other record; a step resolved as not done (the journal's only entry, or
// one amid others) started again by the next holder as a fresh entry of
// its token that it finishes, Steps in start order throughout (also after
// two steps resolved as not done, when a new entry numbered by the count
// of entries would sort before a kept one); cancelled
// contexts; a crashed record behind a history of completed recoverable
// records ([WithHistory], 10,000 by default) returned by the first Lapsed
// after its lapse, and one behind records that expired while due.
// newStore is called once per subtest, as
// for [Run]; each store must be isolated from the others (Lapsed sees only
// its own records). The cases wait for leases together.
func RunRecovery(t *testing.T, newStore func(t *testing.T) idem.Store, opts ...RecoveryOption) {
	cfg := recoveryConfig{history: DefaultHistory}
	for _, o := range opts {
		o(&cfg)
	}
	tests := []storeCase{
		{"LapsedBehindHistory", func(t *testing.T, s idem.Store) { testLapsedBehindHistory(t, s, cfg.history) }},
		{"LapsedPastExpired", testLapsedPastExpired},
		{"SetRecoveryFencing", testRecoveryFencing},
		{"LapsedLifecycle", testRecoveryLifecycle},
		{"NotListedAfterEnd", testRecoveryEnded},
		{"ClaimTakeover", testClaimTakeover},
		{"ClaimBackoff", testClaimBackoff},
		{"ClaimTakesPayloadLease", testClaimLease},
		{"ClaimNotDue", testClaimNotDue},
		{"RacingClaims", testRacingClaims},
		{"AcquireKeepsPayload", testAcquireKeepsPayload},
		{"LapsedHint", testLapsedHint},
		{"ResolveStepUncertain", testResolveStepUncertain},
		{"ResolveStepLapsed", testResolveStepLapsed},
		{"ResolveStepRefused", testResolveStepRefused},
		{"ResolveStepRestart", testResolveStepRestart},
		{"ResolveStepRemovesTwo", testResolveStepRemovesTwo},
		{"RecoveryCancelledContext", testRecoveryCancelled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

// recoveryWait bounds every wait for a lease to lapse or a record to
// become due: far above shortLease, so a loaded machine cannot fail a
// case, and reached only when the store is wrong.
const recoveryWait = 30 * time.Second

func recoverable(t *testing.T, s idem.Store) idem.Recoverable {
	t.Helper()
	r, ok := s.(idem.Recoverable)
	if !ok {
		t.Fatalf("%T does not implement idem.Recoverable", s)
	}
	return r
}

func stepResolver(t *testing.T, s idem.Store) idem.StepResolver {
	t.Helper()
	r, ok := s.(idem.StepResolver)
	if !ok {
		t.Fatalf("%T does not implement idem.StepResolver", s)
	}
	return r
}

// payloadOf returns a recovery payload naming key, with bytes of every kind.
func payloadOf(key string) []byte { return []byte("POST /v1/payments\x00\xff" + key) }

// setRecovery acquires key for tok under fp with a long lease and
// stores its payload with retain.
func setRecovery(t *testing.T, s idem.Store, key, tok, fp string, retain time.Duration) {
	t.Helper()
	mustAcquire(t, s, key, tok, fp, longLease)
	if err := recoverable(t, s).SetRecovery(ctx(t), key, tok, payloadOf(key), retain, longLease); err != nil {
		t.Fatalf("SetRecovery by the holder: %v", err)
	}
}

// withRecovery is setRecovery, then shortens the lease: lapsed a
// shortLease later.
func withRecovery(t *testing.T, s idem.Store, key, tok, fp string, retain time.Duration) {
	t.Helper()
	setRecovery(t, s, key, tok, fp, retain)
	shorten(t, s, key, tok)
}

// testClaimLease: a Claim takes the lease SetRecovery kept with the
// payload, whatever lease Claim is given: a record stored with shortLease
// and claimed with longLease is due again once shortLease passed (polled
// up to recoveryWait, far below longLease), and one stored with an hour and
// claimed with shortLease is still held after shortLease passed.
func testClaimLease(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	short, long := Key(), Key()
	for _, k := range []struct {
		key   string
		lease time.Duration
	}{{short, shortLease}, {long, time.Hour}} {
		tok := Token()
		mustAcquire(t, s, k.key, tok, fingerprint("lease"), longLease)
		if err := r.SetRecovery(ctx(t), k.key, tok, payloadOf(k.key), time.Hour, k.lease); err != nil {
			t.Fatalf("SetRecovery: %v", err)
		}
		shorten(t, s, k.key, tok)
	}
	waitLapse()
	if _, ok, err := r.Claim(ctx(t), short, Token(), longLease, 0); err != nil || !ok {
		t.Fatalf("Claim of the record stored with a %v lease = %v, %v; want claimed", shortLease, ok, err)
	}
	if _, ok, err := r.Claim(ctx(t), long, Token(), shortLease, 0); err != nil || !ok {
		t.Fatalf("Claim of the record stored with an hour's lease = %v, %v; want claimed", ok, err)
	}
	waitLapse()
	if _, ok, err := r.Claim(ctx(t), long, Token(), longLease, 0); err != nil || ok {
		t.Fatalf("Claim %v after a claim of the record stored with an hour's lease = %v, %v; want not claimed: the claim holds an hour, not the %v Claim was given", shortLease, ok, err, shortLease)
	}
	for deadline := time.Now().Add(recoveryWait); ; {
		_, ok, err := r.Claim(ctx(t), short, Token(), longLease, 0)
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record stored with a %v lease, claimed, was not due again within %v: its claim took Claim's %v, not the payload's lease", shortLease, recoveryWait, longLease)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lapsed returns the keys (and attempts) Lapsed reports with a limit
// above what any case stores.
func lapsed(t *testing.T, r idem.Recoverable) map[string]int {
	t.Helper()
	recs, err := r.Lapsed(ctx(t), 1000)
	if err != nil {
		t.Fatalf("Lapsed: %v", err)
	}
	m := make(map[string]int, len(recs))
	for _, rec := range recs {
		m[rec.Key] = rec.Attempts
	}
	return m
}

// waitListed polls Lapsed until it reports key, and returns its attempts.
func waitListed(t *testing.T, r idem.Recoverable, key string) int {
	t.Helper()
	deadline := time.Now().Add(recoveryWait)
	for {
		if n, ok := lapsed(t, r)[key]; ok {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("Lapsed never reported %s within %v", key[:8], recoveryWait)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitClaim claims key for tok as soon as it is due, polling until
// recoveryWait.
func waitClaim(t *testing.T, r idem.Recoverable, key, tok string, backoff time.Duration) idem.RecoveryClaim {
	t.Helper()
	deadline := time.Now().Add(recoveryWait)
	for {
		c, ok, err := r.Claim(ctx(t), key, tok, longLease, backoff)
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		if ok {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("Claim of %s never succeeded within %v", key[:8], recoveryWait)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// mustNotClaim checks that Claim refuses key (not due).
func mustNotClaim(t *testing.T, r idem.Recoverable, key, what string) {
	t.Helper()
	c, ok, err := r.Claim(ctx(t), key, Token(), longLease, 0)
	if err != nil || ok {
		t.Fatalf("Claim of %s = %+v, %v, %v; want claimed = false", what, c, ok, err)
	}
}

func testRecoveryFencing(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	key, tok, fp := Key(), Token(), fingerprint("a")
	if err := r.SetRecovery(ctx(t), key, tok, []byte("p"), time.Hour, longLease); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("SetRecovery on an absent record: %v, want ErrNotOwner", err)
	}
	mustAcquire(t, s, key, tok, fp, longLease)
	if err := r.SetRecovery(ctx(t), key, Token(), []byte("p"), time.Hour, longLease); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("SetRecovery by another token: %v, want ErrNotOwner", err)
	}
	if err := r.SetRecovery(ctx(t), key, tok, []byte("p"), 0, longLease); !errors.Is(err, idem.ErrInvalidDuration) {
		t.Fatalf("SetRecovery with retain 0: %v, want ErrInvalidDuration", err)
	}
	big := bytes.Repeat([]byte{0xcd}, idem.MaxRecoveryBytes)
	if err := r.SetRecovery(ctx(t), key, tok, append(big, 1), time.Hour, longLease); !errors.Is(err, idem.ErrTooLarge) {
		t.Fatalf("SetRecovery above MaxRecoveryBytes: %v, want ErrTooLarge", err)
	}
	if err := r.SetRecovery(ctx(t), key, tok, big, time.Hour, longLease); err != nil {
		t.Fatalf("SetRecovery of MaxRecoveryBytes: %v", err)
	}
	want := payloadOf(key)
	p := bytes.Clone(want)
	if err := r.SetRecovery(ctx(t), key, tok, p, time.Hour, longLease); err != nil { // replaces the earlier one
		t.Fatalf("SetRecovery again: %v", err)
	}
	p[0] = 'X' // the store kept a copy
	shorten(t, s, key, tok)
	waitLapse()
	if err := r.SetRecovery(ctx(t), key, tok, []byte("p"), time.Hour, longLease); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("SetRecovery after the lease lapsed: %v, want ErrNotOwner", err)
	}
	c := waitClaim(t, r, key, Token(), 0)
	if !bytes.Equal(c.Payload, want) {
		t.Fatalf("claimed payload = %d bytes %q…; want the last one given", len(c.Payload), c.Payload[:min(len(c.Payload), 20)])
	}
	// A completed record has no lease to hold.
	key2, tok2 := Key(), Token()
	mustAcquire(t, s, key2, tok2, fp, longLease)
	mustComplete(t, s, key2, tok2, sampleResponse(), retention)
	if err := r.SetRecovery(ctx(t), key2, tok2, []byte("p"), time.Hour, longLease); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("SetRecovery on a completed record: %v, want ErrNotOwner", err)
	}
}

func testRecoveryLifecycle(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	j := journal(t, s)
	fp := fingerprint("a")
	// kept: a long retain; short: a retain of a few leases, then gone.
	kept, short, tok := Key(), Key(), Token()
	setRecovery(t, s, short, tok, fp, 3*shortLease)
	mustAcquire(t, s, kept, tok, fp, longLease)
	startStep(t, j, kept, tok, "charge")
	if err := r.SetRecovery(ctx(t), kept, tok, payloadOf(kept), time.Hour, longLease); err != nil {
		t.Fatal(err)
	}
	if got := lapsed(t, r); len(got) != 0 {
		t.Fatalf("Lapsed while every lease is live = %v; want none", got)
	}
	shorten(t, s, short, tok)
	shorten(t, s, kept, tok)
	if n := waitListed(t, r, kept); n != 0 {
		t.Fatalf("Lapsed reported %d attempts for a record never claimed", n)
	}
	if rec, found := get(t, s, kept); !found || rec.State != idem.StateInProgress || rec.Token != tok {
		t.Fatalf("Get of a lapsed record with a payload = %+v, %v; want it kept, in progress", rec, found)
	}
	deadline := time.Now().Add(recoveryWait)
	for {
		if _, found := get(t, s, short); !found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a lapsed record with a payload outlived its retain by %v", recoveryWait)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, ok := lapsed(t, r)[short]; ok {
		t.Fatal("Lapsed reported a record whose retain ended")
	}
	mustNotClaim(t, r, short, "a record whose retain ended")
	if _, ok := lapsed(t, r)[kept]; !ok {
		t.Fatal("Lapsed no longer reports a due record")
	}
}

// testRecoveryEnded: records whose execution ended are not reported;
// a control record lapsed after them shows that their leases lapsed too.
func testRecoveryEnded(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	j := journal(t, s)
	fp := fingerprint("a")
	completed, released, suspended, evicted, control := Key(), Key(), Key(), Key(), Key()
	tok := Token()
	for _, k := range []string{completed, released, suspended, evicted} {
		setRecovery(t, s, k, tok, fp, time.Hour)
	}
	mustComplete(t, s, completed, tok, sampleResponse(), retention)
	if err := s.Release(ctx(t), released, tok); err != nil {
		t.Fatal(err)
	}
	if err := j.Suspend(ctx(t), suspended, tok, time.Hour); err != nil {
		t.Fatal(err)
	}
	shorten(t, s, evicted, tok)
	withRecovery(t, s, control, tok, fp, time.Hour)
	waitListed(t, r, control)
	in, isInspector := s.(idem.Inspector)
	if isInspector {
		info, found, err := in.Inspect(ctx(t), evicted)
		if err != nil || !found {
			t.Fatalf("Inspect of a lapsed record with a payload = %+v, %v, %v", info, found, err)
		}
		if err := in.Evict(ctx(t), evicted, info.Record); err != nil {
			t.Fatalf("Evict: %v", err)
		}
	}
	got := lapsed(t, r)
	for _, c := range []struct{ key, what string }{
		{completed, "a completed record"}, {released, "a released record"}, {suspended, "a suspended (uncertain) record"},
	} {
		if _, ok := got[c.key]; ok {
			t.Errorf("Lapsed reported %s", c.what)
		}
		mustNotClaim(t, r, c.key, c.what)
	}
	if isInspector {
		if _, ok := got[evicted]; ok {
			t.Error("Lapsed reported an evicted record")
		}
		mustNotClaim(t, r, evicted, "an evicted record")
	}
	mustBeUncertain(t, keeperOf(t, s), suspended, tok, fp)
	if rec, found := get(t, s, completed); !found || rec.State != idem.StateCompleted {
		t.Fatalf("a completed record after a refused Claim = %+v, %v", rec, found)
	}
}

func testClaimTakeover(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	j := journal(t, s)
	key, first, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, first, fp, longLease)
	startStep(t, j, key, first, "charge")
	if err := j.FinishStep(ctx(t), key, first, "charge", []byte("ch_1")); err != nil {
		t.Fatal(err)
	}
	if err := r.SetRecovery(ctx(t), key, first, payloadOf(key), time.Hour, longLease); err != nil {
		t.Fatal(err)
	}
	shorten(t, s, key, first)
	waitListed(t, r, key)
	second := Token()
	c, ok, err := r.Claim(ctx(t), key, second, longLease, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Claim of a due record = %+v, %v, %v; want claimed", c, ok, err)
	}
	if !bytes.Equal(c.Payload, payloadOf(key)) || c.Fingerprint != fp || c.Attempts != 1 || c.PreviousToken != first || c.Lapsed <= 0 {
		t.Fatalf("Claim = %+v; want the payload, fingerprint %s, attempts 1, previous token %s, lapsed > 0", c, fp[:8], first)
	}
	c.Payload[0] = 'X' // the caller's copy
	// The claim is sent twice (a resent pipeline): the second finds its own live lease.
	if c2, ok, err := r.Claim(ctx(t), key, second, longLease, time.Hour); err != nil || ok {
		t.Fatalf("Claim again by the same token = %+v, %v, %v; want claimed = false (its lease is live)", c2, ok, err)
	}
	mustNotClaim(t, r, key, "a claimed record (live lease)")
	if _, ok := lapsed(t, r)[key]; ok {
		t.Fatal("Lapsed reported a record just claimed")
	}
	if rec, found := get(t, s, key); !found || rec.State != idem.StateInProgress || rec.Token != second {
		t.Fatalf("Get after the claim = %+v, %v; want in progress under the claim's token", rec, found)
	}
	if err := s.Complete(ctx(t), key, first, sampleResponse(), retention); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete by the previous holder: %v, want ErrNotOwner", err)
	}
	if _, err := j.StartStep(ctx(t), key, first, "email", time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("StartStep by the previous holder: %v, want ErrNotOwner", err)
	}
	if err := r.SetRecovery(ctx(t), key, first, []byte("p"), time.Hour, longLease); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("SetRecovery by the previous holder: %v, want ErrNotOwner", err)
	}
	if e := startStep(t, j, key, second, "charge"); !e.Done || string(e.Result) != "ch_1" || e.Token != first {
		t.Fatalf("the claimer's StartStep of a journaled step = %+v; want it done with ch_1", e)
	}
	// The claimer's SetRecovery (a new payload) and Complete are its own.
	if err := r.SetRecovery(ctx(t), key, second, []byte("again"), time.Hour, longLease); err != nil {
		t.Fatalf("SetRecovery by the claimer: %v", err)
	}
	mustComplete(t, s, key, second, sampleResponse(), retention)
	if _, ok := lapsed(t, r)[key]; ok {
		t.Fatal("Lapsed reported a record completed by its claimer")
	}
	mustNotClaim(t, r, key, "a record completed by its claimer")
	if st := steps(t, j, key); len(st) != 1 || !st[0].Done {
		t.Fatalf("journal of the completed record = %+v", st)
	}
}

// testClaimBackoff: a claimed record whose claim's lease lapses is due
// again backoff after that lapse (never before it), and the next claim
// counts a second attempt and reports the first claimer's token.
func testClaimBackoff(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	fp := fingerprint("a")
	held, again := Key(), Key() // a long backoff, a short one
	tok := Token()
	withRecovery(t, s, held, tok, fp, time.Hour)
	withRecovery(t, s, again, tok, fp, time.Hour)
	waitListed(t, r, held)
	waitListed(t, r, again)
	c1, c2 := Token(), Token()
	for _, c := range []struct {
		key, tok string
		backoff  time.Duration
	}{{held, c1, time.Hour}, {again, c2, shortLease}} {
		if _, ok, err := r.Claim(ctx(t), c.key, c.tok, longLease, c.backoff); err != nil || !ok {
			t.Fatalf("Claim of a due record: %v, %v", ok, err)
		}
		shorten(t, s, c.key, c.tok)
	}
	// again's claim lapses, then its backoff ends: it is due with one attempt.
	if n := waitListed(t, r, again); n != 1 {
		t.Fatalf("Lapsed reported %d attempts after one claim", n)
	}
	c := waitClaim(t, r, again, Token(), shortLease)
	if c.Attempts != 2 || c.PreviousToken != c2 || !bytes.Equal(c.Payload, payloadOf(again)) {
		t.Fatalf("second Claim = %+v; want attempts 2, previous token %s, the payload kept", c, c2)
	}
	// held's claim lapsed earlier than again's: still in its backoff.
	if _, ok := lapsed(t, r)[held]; ok {
		t.Fatal("Lapsed reported a record within its backoff")
	}
	mustNotClaim(t, r, held, "a record within its backoff")
	if rec, found := get(t, s, held); !found || rec.State != idem.StateInProgress || rec.Token != c1 {
		t.Fatalf("a record in backoff after a refused Claim = %+v, %v; want it unchanged", rec, found)
	}
	// A client retry still takes it over (backoff is the recoverer's only).
	if rec, ok, err := s.Acquire(ctx(t), held, Token(), fp, longLease); err != nil || !ok || rec.Token != c1 {
		t.Fatalf("Acquire of a lapsed record in backoff = %+v, %v, %v; want taken over from %s", rec, ok, err, c1)
	}
}

func testClaimNotDue(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	j := journal(t, s)
	k := keeperOf(t, s)
	fp := fingerprint("a")
	mustNotClaim(t, r, Key(), "an absent record")
	live, tok := Key(), Token()
	mustAcquire(t, s, live, tok, fp, longLease)
	if err := r.SetRecovery(ctx(t), live, tok, payloadOf(live), time.Hour, longLease); err != nil {
		t.Fatal(err)
	}
	mustNotClaim(t, r, live, "a record with a live lease")
	if rec, found := get(t, s, live); !found || rec.Token != tok {
		t.Fatalf("a live record after a refused Claim = %+v, %v", rec, found)
	}
	// Lapsed without a payload (a journal keeps it), and under Keep.Uncertain.
	bare, uncertain, control := Key(), Key(), Key()
	mustAcquire(t, s, bare, tok, fp, longLease)
	startStep(t, j, bare, tok, "charge")
	shorten(t, s, bare, tok)
	if _, ok, err := k.AcquireKeep(ctx(t), uncertain, tok, fp, longLease, idem.Keep{Uncertain: time.Hour}); err != nil || !ok {
		t.Fatalf("AcquireKeep: %v, %v", ok, err)
	}
	if err := r.SetRecovery(ctx(t), uncertain, tok, payloadOf(uncertain), time.Hour, longLease); err != nil {
		t.Fatal(err)
	}
	shorten(t, s, uncertain, tok)
	withRecovery(t, s, control, tok, fp, time.Hour)
	waitListed(t, r, control)
	got := lapsed(t, r)
	for _, c := range []struct{ key, what string }{
		{bare, "a lapsed record without a payload"}, {uncertain, "a record that turned uncertain"},
	} {
		if _, ok := got[c.key]; ok {
			t.Errorf("Lapsed reported %s", c.what)
		}
		mustNotClaim(t, r, c.key, c.what)
	}
	mustBeUncertain(t, k, uncertain, tok, fp)
	if st := steps(t, j, bare); len(st) != 1 {
		t.Fatalf("journal of a lapsed record after a refused Claim = %+v", st)
	}
}

func testRacingClaims(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	key, fp := Key(), fingerprint("a")
	withRecovery(t, s, key, Token(), fp, time.Hour)
	waitListed(t, r, key)
	const racers = 8
	var wins atomic.Int32
	var winner atomic.Value
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := Token()
			<-start
			c, ok, err := r.Claim(ctx(t), key, tok, longLease, 0)
			if err != nil {
				t.Errorf("racing Claim: %v", err)
				return
			}
			if ok {
				wins.Add(1)
				winner.Store(tok)
				if c.Attempts != 1 {
					t.Errorf("the winning Claim counted %d attempts; want 1", c.Attempts)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d racing claims took the record over; want exactly 1", wins.Load())
	}
	mustComplete(t, s, key, winner.Load().(string), sampleResponse(), retention)
}

// testAcquireKeepsPayload: a client's Acquire with the record's
// fingerprint takes the lapsed record over with its payload and attempts
// (a recoverer claims it when that holder stops too); Acquire and
// AcquireKeep with another fingerprint are answered the record unchanged,
// as for a record with a started step, and its recoverer claims it.
func testAcquireKeepsPayload(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	key, other, tok, fp := Key(), Key(), Token(), fingerprint("a")
	withRecovery(t, s, key, tok, fp, time.Hour)
	withRecovery(t, s, other, tok, fp, time.Hour)
	waitListed(t, r, key)
	waitListed(t, r, other)
	claimer := Token()
	if _, ok, err := r.Claim(ctx(t), key, claimer, longLease, 0); err != nil || !ok {
		t.Fatalf("Claim: %v, %v", ok, err)
	}
	shorten(t, s, key, claimer)
	waitLapse()
	client := Token()
	if rec, ok, err := s.Acquire(ctx(t), key, client, fp, longLease); err != nil || !ok || rec.Token != claimer {
		t.Fatalf("client Acquire of a lapsed claimed record = %+v, %v, %v; want taken over from the claimer", rec, ok, err)
	}
	shorten(t, s, key, client)
	c := waitClaim(t, r, key, Token(), 0)
	if !bytes.Equal(c.Payload, payloadOf(key)) || c.Attempts != 2 || c.PreviousToken != client {
		t.Fatalf("Claim after a client's takeover = %+v; want the payload, attempts 2, previous token the client's", c)
	}
	// Another fingerprint's Acquire and AcquireKeep are answered the record
	// unchanged (a payload counts as a started step), and its recoverer
	// claims it with its payload.
	k := keeperOf(t, s)
	for _, a := range []struct {
		name    string
		acquire func() (idem.Record, bool, error)
	}{
		{"Acquire", func() (idem.Record, bool, error) {
			return s.Acquire(ctx(t), other, Token(), fingerprint("b"), longLease)
		}},
		{"AcquireKeep", func() (idem.Record, bool, error) {
			return k.AcquireKeep(ctx(t), other, Token(), fingerprint("b"), longLease, idem.Keep{Uncertain: time.Hour, Tombstone: time.Hour})
		}},
	} {
		rec, ok, err := a.acquire()
		if err != nil || ok || rec.State != idem.StateInProgress || rec.Fingerprint != fp || rec.Token != tok {
			t.Fatalf("%s with another fingerprint of a lapsed record with a payload = %+v, %v, %v; want it answered unchanged, not acquired", a.name, rec, ok, err)
		}
	}
	waitListed(t, r, other)
	c = waitClaim(t, r, other, Token(), 0)
	if !bytes.Equal(c.Payload, payloadOf(other)) || c.Fingerprint != fp || c.Attempts != 1 || c.PreviousToken != tok {
		t.Fatalf("Claim after another fingerprint's acquires = %+v; want the payload, fingerprint, attempts 1, previous token the holder's", c)
	}
}

// testLapsedHint: a due record behind more than limit entries that are
// no longer due (taken over by clients, evicted) is returned by a later
// Lapsed once Claims found those not due (a store may return fewer than
// limit, even none, while it takes them out of the way itself).
func testLapsedHint(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	const limit = 2
	fp, tok := fingerprint("a"), Token()
	ahead := make([]string, 2*limit+1)
	for i := range ahead {
		ahead[i] = Key()
		withRecovery(t, s, ahead[i], tok, fp, time.Hour)
	}
	for _, k := range ahead {
		waitListed(t, r, k)
	}
	due := Key()
	withRecovery(t, s, due, tok, fp, time.Hour)
	waitListed(t, r, due)
	in, isInspector := s.(idem.Inspector)
	for i, k := range ahead {
		if i%2 == 1 && isInspector {
			info, found, err := in.Inspect(ctx(t), k)
			if err != nil || !found {
				t.Fatalf("Inspect: %+v, %v, %v", info, found, err)
			}
			if err := in.Evict(ctx(t), k, info.Record); err != nil {
				t.Fatalf("Evict: %v", err)
			}
			continue
		}
		if _, ok, err := s.Acquire(ctx(t), k, Token(), fp, longLease); err != nil || !ok {
			t.Fatalf("client Acquire of a lapsed record: %v, %v", ok, err)
		}
	}
	for round := 0; ; round++ {
		recs, err := r.Lapsed(ctx(t), limit)
		if err != nil {
			t.Fatalf("Lapsed: %v", err)
		}
		if len(recs) > limit {
			t.Fatalf("Lapsed(%d) returned %d records", limit, len(recs))
		}
		if slices.ContainsFunc(recs, func(l idem.LapsedRecord) bool { return l.Key == due }) {
			break
		}
		if round > 2*len(ahead) {
			t.Fatalf("Lapsed(%d) = %+v in round %d; the due record never came", limit, recs, round)
		}
		for _, l := range recs { // a recoverer claims what it is given
			mustNotClaim(t, r, l.Key, "a record no longer due")
		}
	}
	waitClaim(t, r, due, Token(), 0)
}

// uncertainStep leaves key suspended by its holder inside step email,
// after charge was journaled: a recoverable record ended uncertain.
func uncertainStep(t *testing.T, s idem.Store, key, tok, fp string) {
	t.Helper()
	j := journal(t, s)
	mustAcquire(t, s, key, tok, fp, longLease)
	if err := recoverable(t, s).SetRecovery(ctx(t), key, tok, payloadOf(key), time.Hour, longLease); err != nil {
		t.Fatal(err)
	}
	startStep(t, j, key, tok, "charge")
	if err := j.FinishStep(ctx(t), key, tok, "charge", []byte("ch_1")); err != nil {
		t.Fatal(err)
	}
	startStep(t, j, key, tok, "email")
	if err := j.Suspend(ctx(t), key, tok, time.Hour); err != nil {
		t.Fatal(err)
	}
}

func testResolveStepUncertain(t *testing.T, s idem.Store) {
	res := stepResolver(t, s)
	j := journal(t, s)
	fp := fingerprint("a")
	for _, result := range [][]byte{[]byte("sent\x00\xff"), nil} {
		key, tok := Key(), Token()
		uncertainStep(t, s, key, tok, fp)
		if err := res.ResolveStep(ctx(t), key, "charge", []byte("x")); !errors.Is(err, idem.ErrRecordChanged) {
			t.Fatalf("ResolveStep of a done step: %v, want ErrRecordChanged", err)
		}
		in := bytes.Clone(result)
		if err := res.ResolveStep(ctx(t), key, "email", in); err != nil {
			t.Fatalf("ResolveStep(%q) of an uncertain record: %v", result, err)
		}
		if in != nil {
			in[0] = 'X' // the store kept a copy
		}
		if rec, found := get(t, s, key); !found || rec.State != idem.StateInProgress || rec.Token != tok || rec.Fingerprint != fp {
			t.Fatalf("Get after ResolveStep = %+v, %v; want in progress, token and fingerprint kept", rec, found)
		}
		if err := res.ResolveStep(ctx(t), key, "email", result); !errors.Is(err, idem.ErrRecordChanged) {
			t.Fatalf("ResolveStep again: %v, want ErrRecordChanged (done or absent)", err)
		}
		next := Token()
		rec, ok, err := s.Acquire(ctx(t), key, next, fp, longLease)
		if err != nil || !ok || rec.Token != tok {
			t.Fatalf("Acquire after ResolveStep = %+v, %v, %v; want taken over from %s", rec, ok, err, tok)
		}
		st := steps(t, j, key)
		switch {
		case result != nil && (len(st) != 2 || !st[1].Done || !bytes.Equal(st[1].Result, result) || st[1].Name != "email"):
			t.Fatalf("journal after ResolveStep done = %+v; want email done with its result", st)
		case result == nil && (len(st) != 1 || st[0].Name != "charge" || !st[0].Done):
			t.Fatalf("journal after ResolveStep not done = %+v; want charge only", st)
		}
		if e := startStep(t, j, key, next, "email"); e.Done != (result != nil) {
			t.Fatalf("the new holder's StartStep of the resolved step = %+v", e)
		}
		mustComplete(t, s, key, next, sampleResponse(), retention)
	}
}

func testResolveStepLapsed(t *testing.T, s idem.Store) {
	res := stepResolver(t, s)
	r := recoverable(t, s)
	j := journal(t, s)
	key, tok, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, tok, fp, longLease)
	startStep(t, j, key, tok, "email")
	if err := r.SetRecovery(ctx(t), key, tok, payloadOf(key), time.Hour, longLease); err != nil {
		t.Fatal(err)
	}
	if err := res.ResolveStep(ctx(t), key, "email", []byte("sent")); !errors.Is(err, idem.ErrRecordChanged) {
		t.Fatalf("ResolveStep under a live lease: %v, want ErrRecordChanged", err)
	}
	shorten(t, s, key, tok)
	waitListed(t, r, key)
	// A recoverer claims it with an hour's backoff, and its lease lapses:
	// the record is in backoff, not due.
	claimer := Token()
	if c, ok, err := r.Claim(ctx(t), key, claimer, longLease, time.Hour); err != nil || !ok || c.Attempts != 1 {
		t.Fatalf("Claim of a due record = %+v, %v, %v; want attempts 1", c, ok, err)
	}
	shorten(t, s, key, claimer)
	resolveLapsed(t, res, key, "email", []byte("sent"))
	// Resolved: attempts count from zero again and the backoff is gone, so
	// it is due at once (an hour's backoff is far beyond recoveryWait).
	if n := waitListed(t, r, key); n != 0 {
		t.Fatalf("Lapsed reported %d attempts after ResolveStep; want 0", n)
	}
	c := waitClaim(t, r, key, Token(), 0)
	if c.Attempts != 1 || c.PreviousToken != claimer || !bytes.Equal(c.Payload, payloadOf(key)) {
		t.Fatalf("Claim after ResolveStep = %+v; want attempts 1, the payload, taken over from %s", c, claimer)
	}
	if st := steps(t, j, key); len(st) != 1 || !st[0].Done || string(st[0].Result) != "sent" {
		t.Fatalf("journal after ResolveStep = %+v; want email done", st)
	}
}

func testResolveStepRefused(t *testing.T, s idem.Store) {
	res := stepResolver(t, s)
	j := journal(t, s)
	fp := fingerprint("a")
	refused := func(key, name string, result []byte, what string) {
		t.Helper()
		if err := res.ResolveStep(ctx(t), key, name, result); !errors.Is(err, idem.ErrRecordChanged) {
			t.Fatalf("ResolveStep of %s: %v, want ErrRecordChanged", what, err)
		}
	}
	refused(Key(), "email", []byte("x"), "an absent record")
	key, tok := Key(), Token()
	uncertainStep(t, s, key, tok, fp)
	refused(key, "sms", []byte("x"), "a step never started")
	if err := res.ResolveStep(ctx(t), key, "email", bytes.Repeat([]byte{1}, idem.MaxStepBytes+1)); !errors.Is(err, idem.ErrTooLarge) {
		t.Fatalf("ResolveStep above MaxStepBytes: %v, want ErrTooLarge", err)
	}
	mustBeUncertain(t, keeperOf(t, s), key, tok, fp)
	if err := keeperOf(t, s).Resolve(ctx(t), key, sampleResponse(), retention); err != nil {
		t.Fatal(err)
	}
	refused(key, "email", []byte("x"), "a completed record")
	if st := steps(t, j, key); len(st) != 2 || st[1].Done {
		t.Fatalf("journal after refused ResolveSteps = %+v", st)
	}
	// A lapsed record without a journal expired with its lease.
	plain := Key()
	mustAcquire(t, s, plain, tok, fp, shortLease)
	waitLapse()
	refused(plain, "email", nil, "an expired record")
}

func testRecoveryCancelled(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	res := stepResolver(t, s)
	j := journal(t, s)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	key, tok, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, tok, fp, longLease)
	startStep(t, j, key, tok, "email")
	if err := r.SetRecovery(cancelled, key, tok, payloadOf(key), time.Hour, longLease); err == nil {
		t.Fatal("SetRecovery with a cancelled context succeeded")
	}
	if _, err := r.Lapsed(cancelled, 10); err == nil {
		t.Fatal("Lapsed with a cancelled context succeeded")
	}
	if err := r.SetRecovery(ctx(t), key, tok, []byte("kept"), time.Hour, longLease); err != nil {
		t.Fatal(err)
	}
	if err := r.SetRecovery(cancelled, key, tok, []byte("lost"), time.Hour, longLease); err == nil {
		t.Fatal("SetRecovery with a cancelled context succeeded")
	}
	shorten(t, s, key, tok)
	waitListed(t, r, key)
	if err := res.ResolveStep(cancelled, key, "email", []byte("sent")); err == nil {
		t.Fatal("ResolveStep with a cancelled context succeeded")
	}
	if _, ok, err := r.Claim(cancelled, key, Token(), longLease, 0); err == nil || ok {
		t.Fatalf("Claim with a cancelled context = %v, %v; want an error", ok, err)
	}
	c := waitClaim(t, r, key, Token(), 0)
	if c.Attempts != 1 || string(c.Payload) != "kept" || c.PreviousToken != tok {
		t.Fatalf("Claim after cancelled calls = %+v; want attempts 1, the payload kept, taken over from %s", c, tok)
	}
	if st := steps(t, j, key); len(st) != 1 || st[0].Done {
		t.Fatalf("journal after a cancelled ResolveStep = %+v; want email not done", st)
	}
}

// resolveLapsed calls ResolveStep until the record's lease has lapsed (it
// answers ErrRecordChanged while the lease is live), within recoveryWait.
func resolveLapsed(t *testing.T, res idem.StepResolver, key, name string, result []byte) {
	t.Helper()
	deadline := time.Now().Add(recoveryWait)
	for {
		err := res.ResolveStep(ctx(t), key, name, result)
		switch {
		case err == nil:
			return
		case !errors.Is(err, idem.ErrRecordChanged) || time.Now().After(deadline):
			t.Fatalf("ResolveStep(%q) of a lapsed record: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testResolveStepRemovesTwo: two of four entries resolved as not done,
// then the next holder's new step is the journal's last. A store that
// numbers a new entry by the count of entries and does not move later
// entries down on a removal gives it the index of a removed one, below
// the kept last entry's: Steps' order tells, whatever order the store
// breaks ties in.
func testResolveStepRemovesTwo(t *testing.T, s idem.Store) {
	res := stepResolver(t, s)
	j := journal(t, s)
	key, tok, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, tok, fp, longLease)
	for _, name := range []string{"quote", "charge", "email", "ledger"} {
		startStep(t, j, key, tok, name)
		if name == "quote" || name == "ledger" {
			if err := j.FinishStep(ctx(t), key, tok, name, []byte(name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	shorten(t, s, key, tok)
	resolveLapsed(t, res, key, "charge", nil)
	resolveLapsed(t, res, key, "email", nil)
	wantSteps(t, j, key, "after two steps resolved as not done", "quote", "ledger")
	next := Token()
	if rec, ok, err := s.Acquire(ctx(t), key, next, fp, longLease); err != nil || !ok || rec.Token != tok {
		t.Fatalf("Acquire after ResolveStep = %+v, %v, %v; want taken over from %s", rec, ok, err, tok)
	}
	startStep(t, j, key, next, "charge")
	wantSteps(t, j, key, "after the restart", "quote", "ledger", "charge")
	mustComplete(t, s, key, next, sampleResponse(), retention)
}

// wantSteps fails unless key's journal holds exactly the entries named,
// in that order.
func wantSteps(t *testing.T, j idem.Journal, key, what string, names ...string) []idem.StepEntry {
	t.Helper()
	st := steps(t, j, key)
	got := make([]string, len(st))
	for i, e := range st {
		got[i] = e.Name
	}
	if !slices.Equal(got, names) {
		t.Fatalf("journal %s = %v; want %v (start order)", what, got, names)
	}
	return st
}

func testResolveStepRestart(t *testing.T, s idem.Store) {
	res := stepResolver(t, s)
	j := journal(t, s)
	fp := fingerprint("a")
	// Two journals: "charge" alone, and "charge" amid finished steps and a
	// parallel step left open, enough entries (17) that a store ordering
	// them by an index two entries share may answer them out of order.
	var before []string
	for i := range 13 {
		before = append(before, "p"+string(rune('a'+i)))
	}
	cases := []struct {
		key, tok      string
		before, after []string // started before "charge"; after it, the last one left open
	}{
		{Key(), Token(), nil, nil},
		{Key(), Token(), before, []string{"q0", "q1"}},
	}
	for _, c := range cases {
		mustAcquire(t, s, c.key, c.tok, fp, longLease)
		for _, name := range c.before {
			startStep(t, j, c.key, c.tok, name)
			if err := j.FinishStep(ctx(t), c.key, c.tok, name, []byte(name)); err != nil {
				t.Fatal(err)
			}
		}
		startStep(t, j, c.key, c.tok, "charge")
		for i, name := range c.after {
			startStep(t, j, c.key, c.tok, name)
			if i < len(c.after)-1 {
				if err := j.FinishStep(ctx(t), c.key, c.tok, name, []byte(name)); err != nil {
					t.Fatal(err)
				}
			}
		}
		shorten(t, s, c.key, c.tok)
	}
	for _, c := range cases {
		resolveLapsed(t, res, c.key, "charge", nil)
		kept := slices.Concat(c.before, c.after)
		wantSteps(t, j, c.key, "after ResolveStep not done", kept...)
		next := Token()
		rec, ok, err := s.Acquire(ctx(t), c.key, next, fp, longLease)
		if err != nil || !ok || rec.Token != c.tok {
			t.Fatalf("Acquire after ResolveStep = %+v, %v, %v; want taken over from %s", rec, ok, err, c.tok)
		}
		fresh := []string{"charge"}
		if c.after != nil {
			fresh = []string{"r0", "charge"}
			startStep(t, j, c.key, next, "r0")
		}
		if e := startStep(t, j, c.key, next, "charge"); e.Name != "charge" || e.Token != next || e.Done || e.Result != nil {
			t.Fatalf("the new holder's StartStep of the removed step = %+v; want a fresh entry of token %s", e, next)
		}
		if err := j.FinishStep(ctx(t), c.key, next, "charge", []byte("ch_2")); err != nil {
			t.Fatalf("FinishStep of the restarted step: %v", err)
		}
		st := wantSteps(t, j, c.key, "after the restart", slices.Concat(kept, fresh)...)
		if e := st[len(st)-1]; e.Token != next || !e.Done || string(e.Result) != "ch_2" {
			t.Fatalf("the restarted step = %+v; want done by %s with its result", e, next)
		}
		for _, e := range st[:len(kept)] {
			if e.Token != c.tok || e.Done != (e.Name != "q1") {
				t.Fatalf("an entry kept by ResolveStep = %+v; want %s's, done unless q1", e, c.tok)
			}
		}
		mustComplete(t, s, c.key, next, sampleResponse(), retention)
	}
}
