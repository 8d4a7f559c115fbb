package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// RunJournal checks [idem.Journal] on the store, directly and through
// [idem.Step] in [idem.Do]: entries started once and finished once, fenced
// by the lease (another token, a lapsed lease, a holder taken over);
// takeovers reported with the previous owner and resuming the journal;
// a lapsed record with a journal kept for its retain and refused to
// another fingerprint; the journal kept by Complete and Suspend, deleted
// by Release, Resolve and expiry; the limits; racing holders; and steps
// through the engine (journaled results replayed after a takeover, an
// unknown step ending the execution uncertain, a repeatable one run
// again, a stalled holder unable to journal, a function failing after a
// finished step leaving its journal to the retry). newStore is called once per
// subtest, as for [Run]; the cases wait for leases together.
func RunJournal(t *testing.T, newStore func(t *testing.T) idem.Store) {
	tests := []storeCase{
		{"StartFinish", testJournalStartFinish},
		{"Fencing", testJournalFencing},
		{"TakeoverResumes", testJournalTakeover},
		{"OtherFingerprint", testJournalOtherFingerprint},
		{"Lifecycle", testJournalLifecycle},
		{"Limits", testJournalLimits},
		{"RacingTakeover", testJournalRacing},
		{"StepsThroughDo", testStepsThroughDo},
		{"StalledHolderCannotJournal", testStepStalledHolder},
		{"FailureAfterStepKeepsJournal", testStepFailKeepsJournal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

func journal(t *testing.T, s idem.Store) idem.Journal {
	t.Helper()
	j, ok := s.(idem.Journal)
	if !ok {
		t.Fatalf("%T does not implement idem.Journal", s)
	}
	return j
}

func startStep(t *testing.T, j idem.Journal, key, token, name string) idem.StepEntry {
	t.Helper()
	e, err := j.StartStep(ctx(t), key, token, name, time.Hour)
	if err != nil {
		t.Fatalf("StartStep(%q): %v", name, err)
	}
	return e
}

func steps(t *testing.T, j idem.Journal, key string) []idem.StepEntry {
	t.Helper()
	st, err := j.Steps(ctx(t), key)
	if err != nil {
		t.Fatalf("Steps: %v", err)
	}
	return st
}

// waitLapse sleeps past a shortLease taken just before.
func waitLapse() { time.Sleep(shortLease + 200*time.Millisecond) }

// shorten sets the lease token holds on key to shortLease from now: the
// cases acquire with longLease, journal, then shorten, so that a slow store
// on a loaded machine cannot lapse the lease before the journal is written.
func shorten(t *testing.T, s idem.Store, key, token string) {
	t.Helper()
	ext, ok := s.(idem.Extender)
	if !ok {
		t.Fatalf("%T implements idem.Journal, not idem.Extender", s)
	}
	if err := ext.Extend(ctx(t), key, token, shortLease); err != nil {
		t.Fatalf("Extend to a short lease: %v", err)
	}
}

func testJournalStartFinish(t *testing.T, s idem.Store) {
	j := journal(t, s)
	key, tok, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, tok, fp, longLease)
	if st := steps(t, j, key); st != nil {
		t.Fatalf("Steps of a new record = %+v, want nil", st)
	}
	if e := startStep(t, j, key, tok, "charge"); e.Name != "charge" || e.Token != tok || e.Done || e.Result != nil {
		t.Fatalf("StartStep of a new step = %+v", e)
	}
	if e := startStep(t, j, key, tok, "charge"); e.Name != "charge" || e.Token != tok || e.Done {
		t.Fatalf("StartStep again = %+v; want the started entry", e)
	}
	result := []byte("v\x00\xff{\"id\":\"ch_1\"}")
	if err := j.FinishStep(ctx(t), key, tok, "charge", result); err != nil {
		t.Fatalf("FinishStep: %v", err)
	}
	result[0] = 'X' // the store kept a copy
	if err := j.FinishStep(ctx(t), key, tok, "charge", []byte("other")); err != nil {
		t.Fatalf("FinishStep of a done step (a retry whose reply was lost): %v", err)
	}
	e := startStep(t, j, key, tok, "charge")
	if !e.Done || !bytes.Equal(e.Result, []byte("v\x00\xff{\"id\":\"ch_1\"}")) {
		t.Fatalf("StartStep of a done step = %+v; want the first result", e)
	}
	e.Result[0] = 'Y' // a copy: the stored one is unchanged
	startStep(t, j, key, tok, "email")
	if err := j.FinishStep(ctx(t), key, tok, "email", []byte{}); err != nil {
		t.Fatalf("FinishStep with an empty result: %v", err)
	}
	st := steps(t, j, key)
	if len(st) != 2 || st[0].Name != "charge" || st[1].Name != "email" || !st[0].Done || !st[1].Done ||
		!bytes.Equal(st[0].Result, []byte("v\x00\xff{\"id\":\"ch_1\"}")) || st[1].Result == nil || len(st[1].Result) != 0 {
		t.Fatalf("Steps = %+v; want charge then email, both done, results kept (empty, not nil)", st)
	}
	if err := j.FinishStep(ctx(t), key, tok, "never-started", []byte("x")); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("FinishStep of a step never started: %v, want ErrNotOwner", err)
	}
}

func testJournalFencing(t *testing.T, s idem.Store) {
	j := journal(t, s)
	key, tok, fp := Key(), Token(), fingerprint("a")
	if _, err := j.StartStep(ctx(t), key, tok, "charge", time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("StartStep on an absent record: %v, want ErrNotOwner", err)
	}
	mustAcquire(t, s, key, tok, fp, longLease)
	startStep(t, j, key, tok, "charge")
	shorten(t, s, key, tok)
	other := Token()
	if _, err := j.StartStep(ctx(t), key, other, "email", time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("StartStep by another token: %v, want ErrNotOwner", err)
	}
	if err := j.FinishStep(ctx(t), key, other, "charge", []byte("x")); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("FinishStep by another token: %v, want ErrNotOwner", err)
	}
	if err := j.Suspend(ctx(t), key, other, time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Suspend by another token: %v, want ErrNotOwner", err)
	}
	waitLapse()
	if _, err := j.StartStep(ctx(t), key, tok, "email", time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("StartStep after the lease lapsed: %v, want ErrNotOwner", err)
	}
	if err := j.FinishStep(ctx(t), key, tok, "charge", []byte("x")); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("FinishStep after the lease lapsed: %v, want ErrNotOwner", err)
	}
	if err := j.Suspend(ctx(t), key, tok, time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Suspend after the lease lapsed: %v, want ErrNotOwner", err)
	}
	if err := s.Complete(ctx(t), key, tok, sampleResponse(), retention); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete after the lease of a record with a journal lapsed: %v, want ErrNotOwner", err)
	}
	if st := steps(t, j, key); len(st) != 1 || st[0].Done {
		t.Fatalf("Steps after refused writes = %+v; want charge, not done", st)
	}
}

func testJournalTakeover(t *testing.T, s idem.Store) {
	j := journal(t, s)
	key, first, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, first, fp, longLease)
	startStep(t, j, key, first, "charge")
	if err := j.FinishStep(ctx(t), key, first, "charge", []byte("ch_1")); err != nil {
		t.Fatal(err)
	}
	startStep(t, j, key, first, "email")
	shorten(t, s, key, first)
	waitLapse()
	if rec, found := get(t, s, key); !found || rec.State != idem.StateInProgress {
		t.Fatalf("Get of a lapsed record with a journal = %+v, %v; want it kept, in progress", rec, found)
	}
	if in, ok := s.(idem.Inspector); ok { // an operator sees a lapsed lease, not one held for the retain
		info, found, err := in.Inspect(ctx(t), key)
		if err != nil || !found || info.State != idem.StateInProgress || info.TTL > 0 {
			t.Fatalf("Inspect of a lapsed record with a journal = %+v, %v, %v; want in progress with TTL <= 0", info, found, err)
		}
	}
	second := Token()
	rec, ok, err := s.Acquire(ctx(t), key, second, fp, longLease)
	if err != nil || !ok {
		t.Fatalf("Acquire of a lapsed record with a journal = %+v, %v, %v; want taken over", rec, ok, err)
	}
	if rec.State != idem.StateInProgress || rec.Token != first || rec.LeaseLeft >= 0 {
		t.Fatalf("takeover reported %+v; want in-progress, the previous token %q, LeaseLeft < 0", rec, first)
	}
	if e := startStep(t, j, key, second, "charge"); !e.Done || string(e.Result) != "ch_1" {
		t.Fatalf("the new holder's StartStep of a done step = %+v; want its result", e)
	}
	if e := startStep(t, j, key, second, "email"); e.Done || e.Token != first {
		t.Fatalf("the new holder's StartStep of a step started before the crash = %+v; want it not done, started by %q", e, first)
	}
	if err := j.FinishStep(ctx(t), key, second, "email", []byte("sent")); err != nil {
		t.Fatalf("the new holder's FinishStep: %v", err)
	}
	mustComplete(t, s, key, second, sampleResponse(), retention)
	if st := steps(t, j, key); len(st) != 2 || !st[1].Done || string(st[1].Result) != "sent" {
		t.Fatalf("Steps of the completed record = %+v; want both done", st)
	}
	// A plain takeover, no journal: a fresh record, reported when the store still holds the lapsed one.
	key2 := Key()
	mustAcquire(t, s, key2, first, fp, shortLease)
	waitLapse()
	rec, ok, err = s.Acquire(ctx(t), key2, second, fp, longLease)
	if err != nil || !ok || rec.Token != "" && (rec.Token != first || rec.LeaseLeft >= 0) {
		t.Fatalf("Acquire of a lapsed record without a journal = %+v, %v, %v; want acquired, zero or the previous owner", rec, ok, err)
	}
	if st := steps(t, j, key2); st != nil {
		t.Fatalf("journal after a takeover without steps = %+v", st)
	}
}

func testJournalOtherFingerprint(t *testing.T, s idem.Store) {
	j := journal(t, s)
	key, first, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, first, fp, longLease)
	startStep(t, j, key, first, "charge")
	shorten(t, s, key, first)
	waitLapse()
	rec, ok, err := s.Acquire(ctx(t), key, Token(), fingerprint("b"), longLease)
	if err != nil || ok || rec.State != idem.StateInProgress || rec.Fingerprint != fp {
		t.Fatalf("Acquire with another fingerprint of a lapsed record with a journal = %+v, %v, %v; want it answered, not taken over", rec, ok, err)
	}
	if st := steps(t, j, key); len(st) != 1 {
		t.Fatalf("journal after a refused takeover = %+v", st)
	}
	// Without a journal another fingerprint takes over.
	key2 := Key()
	mustAcquire(t, s, key2, first, fp, shortLease)
	waitLapse()
	if _, ok, err := s.Acquire(ctx(t), key2, Token(), fingerprint("b"), longLease); err != nil || !ok {
		t.Fatalf("Acquire with another fingerprint of a lapsed record without a journal: %v, %v; want taken over", ok, err)
	}
}

func testJournalLifecycle(t *testing.T, s idem.Store) {
	j := journal(t, s)
	k := keeperOf(t, s)
	fp := fingerprint("a")
	// Release deletes the journal.
	key, tok := Key(), Token()
	mustAcquire(t, s, key, tok, fp, longLease)
	startStep(t, j, key, tok, "charge")
	if err := s.Release(ctx(t), key, tok); err != nil {
		t.Fatal(err)
	}
	if st := steps(t, j, key); st != nil {
		t.Fatalf("journal after Release = %+v", st)
	}
	tok = Token()
	mustAcquire(t, s, key, tok, fp, longLease)
	if e := startStep(t, j, key, tok, "charge"); e.Token != tok || e.Done {
		t.Fatalf("StartStep after Release and a new Acquire = %+v; want a fresh entry", e)
	}
	// Suspend: uncertain, journal kept, the owner token reported; Resolve(nil) deletes both.
	if err := j.Suspend(ctx(t), key, tok, 0); !errors.Is(err, idem.ErrInvalidDuration) {
		t.Fatalf("Suspend with keep 0: %v, want ErrInvalidDuration", err)
	}
	if err := j.Suspend(ctx(t), key, tok, time.Hour); err != nil {
		t.Fatalf("Suspend: %v", err)
	}
	mustBeUncertain(t, k, key, tok, fp)
	if st := steps(t, j, key); len(st) != 1 {
		t.Fatalf("journal of a suspended record = %+v", st)
	}
	if err := k.Resolve(ctx(t), key, nil, retention); err != nil {
		t.Fatalf("Resolve(nil) of a suspended record: %v", err)
	}
	if st := steps(t, j, key); st != nil {
		t.Fatalf("journal after Resolve(nil) = %+v", st)
	}
	// Resolve with a response keeps it; expiry ends it.
	key, tok = Key(), Token()
	mustAcquire(t, s, key, tok, fp, longLease)
	startStep(t, j, key, tok, "charge")
	if err := j.Suspend(ctx(t), key, tok, longLease); err != nil {
		t.Fatal(err)
	}
	if err := k.Resolve(ctx(t), key, sampleResponse(), shortLease); err != nil {
		t.Fatalf("Resolve with a response: %v", err)
	}
	if st := steps(t, j, key); len(st) != 1 {
		t.Fatalf("journal after Resolve with a response = %+v", st)
	}
	waitLapse()
	if st := steps(t, j, key); st != nil {
		t.Fatalf("journal after the retention ended = %+v", st)
	}
	// A lapsed record with a journal expires with its retain.
	key, tok = Key(), Token()
	mustAcquire(t, s, key, tok, fp, longLease)
	if _, err := j.StartStep(ctx(t), key, tok, "charge", shortLease); err != nil {
		t.Fatal(err)
	}
	shorten(t, s, key, tok)
	time.Sleep(2*shortLease + 300*time.Millisecond)
	if st := steps(t, j, key); st != nil {
		t.Fatalf("journal after lease and retain ended = %+v", st)
	}
	if _, found := get(t, s, key); found {
		t.Fatal("a record found after its lease and retain ended")
	}
}

// keeperOf returns s as an [idem.Keeper], failing when it is not one.
func keeperOf(t *testing.T, s idem.Store) idem.Keeper {
	t.Helper()
	k, ok := s.(idem.Keeper)
	if !ok {
		t.Fatalf("%T implements idem.Journal, not idem.Keeper", s)
	}
	return k
}

func testJournalLimits(t *testing.T, s idem.Store) {
	j := journal(t, s)
	key, tok := Key(), Token()
	mustAcquire(t, s, key, tok, fingerprint("a"), longLease)
	if _, err := j.StartStep(ctx(t), key, tok, "a", 0); !errors.Is(err, idem.ErrInvalidDuration) {
		t.Fatalf("StartStep with retain 0: %v, want ErrInvalidDuration", err)
	}
	for i := range idem.MaxSteps {
		startStep(t, j, key, tok, fmt.Sprintf("step-%02d", i))
	}
	if _, err := j.StartStep(ctx(t), key, tok, "one-too-many", time.Hour); !errors.Is(err, idem.ErrTooManySteps) {
		t.Fatalf("StartStep past MaxSteps: %v, want ErrTooManySteps", err)
	}
	if e := startStep(t, j, key, tok, "step-00"); e.Name != "step-00" {
		t.Fatalf("StartStep of an existing step of a full journal = %+v", e)
	}
	big := bytes.Repeat([]byte{0xab}, idem.MaxStepBytes)
	if err := j.FinishStep(ctx(t), key, tok, "step-00", append(big, 1)); !errors.Is(err, idem.ErrTooLarge) {
		t.Fatalf("FinishStep above MaxStepBytes: %v, want ErrTooLarge", err)
	}
	if err := j.FinishStep(ctx(t), key, tok, "step-00", big); err != nil {
		t.Fatalf("FinishStep of MaxStepBytes: %v", err)
	}
	if e := startStep(t, j, key, tok, "step-00"); !bytes.Equal(e.Result, big) {
		t.Fatalf("a MaxStepBytes result came back with %d bytes", len(e.Result))
	}
}

func testJournalRacing(t *testing.T, s idem.Store) {
	j := journal(t, s)
	key, first, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, first, fp, longLease)
	startStep(t, j, key, first, "charge")
	shorten(t, s, key, first)
	waitLapse()
	const racers = 8
	var wins atomic.Int32
	var winner atomic.Value
	var wg sync.WaitGroup
	for range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := Token()
			_, ok, err := s.Acquire(ctx(t), key, tok, fp, longLease)
			if err != nil {
				t.Errorf("racing Acquire: %v", err)
				return
			}
			if ok {
				wins.Add(1)
				winner.Store(tok)
			}
			// Every racer tries to journal: only the winner may.
			_, err = j.StartStep(ctx(t), key, tok, "email", time.Hour)
			if ok != (err == nil) {
				t.Errorf("racer (acquired %v) StartStep: %v", ok, err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d racers took the lapsed record over; want exactly 1", wins.Load())
	}
	st := steps(t, j, key)
	if len(st) != 2 || st[0].Token != first || st[1].Token != winner.Load() {
		t.Fatalf("journal after the race = %+v; want charge by the crashed holder, email by the winner", st)
	}
}

// Stalling wraps a store (an [idem.Extender], [idem.Keeper] and
// [idem.Journal]) and hides [idem.LocalStore], so that an engine takes
// real leases even on memstore, and fails every Extend once [Stalling.Stall]
// was called: a holder whose process stalls and stops renewing, while it
// still runs.
type Stalling struct {
	idem.Store
	stalled atomic.Bool
}

// NewStalling returns s wrapped; every method but Extend goes to s.
func NewStalling(s idem.Store) *Stalling { return &Stalling{Store: s} }

// Stall makes every later Extend fail: the engine's renewals stop, and
// the lease lapses while the handler still runs.
func (s *Stalling) Stall() { s.stalled.Store(true) }

// Extend renews the lease through the wrapped store, or fails once stalled.
func (s *Stalling) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if s.stalled.Load() {
		return errors.New("storetest: stalled")
	}
	return s.Store.(idem.Extender).Extend(ctx, key, token, lease)
}

// AcquireKeep is the wrapped store's [idem.Keeper.AcquireKeep].
func (s *Stalling) AcquireKeep(ctx context.Context, key, token, fp string, lease time.Duration, keep idem.Keep) (idem.Record, bool, error) {
	return s.Store.(idem.Keeper).AcquireKeep(ctx, key, token, fp, lease, keep)
}

// Resolve is the wrapped store's [idem.Keeper.Resolve].
func (s *Stalling) Resolve(ctx context.Context, key string, response []byte, retention time.Duration) error {
	return s.Store.(idem.Keeper).Resolve(ctx, key, response, retention)
}

// StartStep is the wrapped store's [idem.Journal.StartStep].
func (s *Stalling) StartStep(ctx context.Context, key, token, name string, retain time.Duration) (idem.StepEntry, error) {
	return s.Store.(idem.Journal).StartStep(ctx, key, token, name, retain)
}

// FinishStep is the wrapped store's [idem.Journal.FinishStep].
func (s *Stalling) FinishStep(ctx context.Context, key, token, name string, result []byte) error {
	return s.Store.(idem.Journal).FinishStep(ctx, key, token, name, result)
}

// Suspend is the wrapped store's [idem.Journal.Suspend].
func (s *Stalling) Suspend(ctx context.Context, key, token string, keep time.Duration) error {
	return s.Store.(idem.Journal).Suspend(ctx, key, token, keep)
}

// Steps is the wrapped store's [idem.Journal.Steps].
func (s *Stalling) Steps(ctx context.Context, key string) ([]idem.StepEntry, error) {
	return s.Store.(idem.Journal).Steps(ctx, key)
}

// takeoverRecorder collects the engine's takeover events.
type takeoverRecorder struct {
	mu     sync.Mutex
	events []idem.Event
}

func (r *takeoverRecorder) hook(_ context.Context, ev idem.Event) {
	if ev.Kind == idem.EventTakeover || ev.Kind == idem.EventUncertain {
		r.mu.Lock()
		r.events = append(r.events, ev)
		r.mu.Unlock()
	}
}

func (r *takeoverRecorder) kinds() []idem.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	var k []idem.EventKind
	for _, ev := range r.events {
		k = append(k, ev.Kind)
	}
	return k
}

// crashedExecution leaves key as a crashed holder would: acquired with a
// short lease under fp, charge journaled with result, email started and
// not journaled; then waits for the lease to lapse.
func crashedExecution(t *testing.T, s idem.Store, key, fp string, charge []byte) {
	t.Helper()
	j := journal(t, s)
	tok := "crashed:1:x.1"
	mustAcquire(t, s, key, tok, fp, longLease)
	startStep(t, j, key, tok, "charge")
	if err := j.FinishStep(ctx(t), key, tok, "charge", charge); err != nil {
		t.Fatal(err)
	}
	startStep(t, j, key, tok, "email")
	shorten(t, s, key, tok)
	waitLapse()
}

type charge struct{ ID string }

// testStepsThroughDo runs [idem.Step] in [idem.Do] over a crashed
// execution's journal: the journaled step is not run again, the step left
// unknown ends the execution uncertain (or runs again when repeatable),
// and a takeover event names the crashed owner.
func testStepsThroughDo(t *testing.T, s idem.Store) {
	// A journaled result as Step encodes it, made by Step itself on a first key.
	var rec takeoverRecorder
	// No holder stalls here: the store timeout is one that holds on a
	// loaded machine (a takeover timed out after the store applied it
	// would be taken over again, by this test's own token).
	e := doEngine(t, NewStalling(s), idem.WithLease(longLease), idem.WithStoreTimeout(10*time.Second), idem.WithEventHook(rec.hook))
	j := journal(t, s)
	var charges, emails atomic.Int32
	chargeStep := func(ctx context.Context) (charge, error) {
		return idem.Step(ctx, "charge", func(ctx context.Context) (charge, error) {
			if k, ok := idem.DerivedKey(ctx); !ok || len(k) != 69 {
				t.Errorf("DerivedKey in a step = %q, %v", k, ok)
			}
			return charge{ID: fmt.Sprintf("ch_%d", charges.Add(1))}, nil
		})
	}
	op := doOp("p1")
	first, err := idem.Do(ctx(t), e, op, chargeStep)
	if err != nil || first.ID != "ch_1" {
		t.Fatalf("first Do = %+v, %v", first, err)
	}
	scoped := idem.ScopedKey(op.Scope, "(do)", op.Name, op.Key)
	st := steps(t, j, scoped)
	if len(st) != 1 || !st[0].Done {
		t.Fatalf("journal after a completed Do = %+v", st)
	}
	journaled := st[0].Result

	for _, repeatable := range []bool{false, true} {
		op := doOp("p1")
		key := idem.ScopedKey(op.Scope, "(do)", op.Name, op.Key)
		crashedExecution(t, s, key, idem.Fingerprint("(do)", op.Name, "", "", op.Payload), journaled)
		before, seen := charges.Load(), len(rec.kinds())
		fn := func(ctx context.Context) (string, error) {
			c, err := chargeStep(ctx)
			if err != nil {
				return "", err
			}
			var opts []idem.StepOption
			if repeatable {
				opts = append(opts, idem.Repeatable())
			}
			return idem.Step(ctx, "email", func(ctx context.Context) (string, error) {
				emails.Add(1)
				return "sent for " + c.ID, nil
			}, opts...)
		}
		got, err := idem.Do(ctx(t), e, op, fn)
		if charges.Load() != before {
			t.Fatalf("repeatable %v: the journaled charge ran again", repeatable)
		}
		if !repeatable {
			if !errors.Is(err, idem.ErrStepUncertain) || !errors.Is(err, idem.ErrUncertain) {
				t.Fatalf("Do over a step of unknown outcome = %q, %v; want ErrStepUncertain", got, err)
			}
			if _, err := idem.Do(ctx(t), e, op, fn); !errors.Is(err, idem.ErrUncertain) {
				t.Fatalf("Do after the execution ended uncertain: %v, want ErrUncertain", err)
			}
			if k := rec.kinds()[seen:]; len(k) < 2 || k[0] != idem.EventTakeover || k[1] != idem.EventUncertain {
				t.Fatalf("events = %v; want takeover, then uncertain", k)
			}
			continue
		}
		if err != nil || got != "sent for ch_1" {
			t.Fatalf("Do over a repeatable step = %q, %v; want the email sent with the journaled charge", got, err)
		}
		if again, err := idem.Do(ctx(t), e, op, fn); err != nil || again != got {
			t.Fatalf("duplicate Do = %q, %v; want the stored result", again, err)
		}
	}
	if emails.Load() != 1 {
		t.Fatalf("emails sent = %d; want 1 (the repeatable case only)", emails.Load())
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, ev := range rec.events {
		if ev.Kind == idem.EventTakeover && (ev.PreviousOwner != "crashed:1:x.1" || ev.Lapsed <= 0) {
			t.Fatalf("takeover event %+v; want the crashed owner and a lapse > 0", ev)
		}
	}
}

// testStepStalledHolder: a holder that stops renewing while its handler
// still runs is taken over; its step's journal write is then refused,
// the new holder finishes the work once, and the stalled one's
// completion is refused.
func testStepStalledHolder(t *testing.T, s idem.Store) {
	st := NewStalling(s)
	e := doEngine(t, st, idem.WithLease(shortLease*4), idem.WithStoreTimeout(shortLease))
	op := doOp("p1")
	var runs atomic.Int32
	release := make(chan struct{})
	inStep := make(chan struct{})
	stalledErr := make(chan error, 1)
	go func() {
		_, err := idem.Do(context.Background(), e, op, func(ctx context.Context) (int, error) {
			return idem.Step(ctx, "charge", func(context.Context) (int, error) {
				n := runs.Add(1)
				if n == 1 {
					st.Stall() // this holder stops renewing
					close(inStep)
					<-release
				}
				return int(n), nil
			}, idem.Repeatable())
		})
		stalledErr <- err
	}()
	<-inStep
	// A hang guard; on a loaded machine a 300ms store call may time out:
	// that answer is retryable, as in progress is, and retried as a client
	// would.
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var got int
	for {
		v, err := idem.Do(c, e, op, func(ctx context.Context) (int, error) {
			return idem.Step(ctx, "charge", func(context.Context) (int, error) { return int(runs.Add(1)), nil }, idem.Repeatable())
		})
		if err == nil {
			got = v
			break
		}
		if !idem.OutcomeOfError(err).Retryable() || c.Err() != nil {
			close(release)
			t.Fatalf("waiting for the takeover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(release)
	if err := <-stalledErr; err == nil {
		t.Fatal("the stalled holder's Do succeeded after its lease was taken over")
	}
	if got != 2 || runs.Load() != 2 {
		t.Fatalf("the new holder got %d after %d runs; want its own run, 2", got, runs.Load())
	}
	v, err := idem.Do(c, e, op, func(context.Context) (int, error) { return 99, nil })
	if err != nil || v != 2 {
		t.Fatalf("duplicate after both holders ended = %d, %v; want the new holder's 2", v, err)
	}
}
