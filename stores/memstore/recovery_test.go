package memstore_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
)

// recoveryEngine returns an engine over a memstore that looks like a
// shared store whose holders can crash (no renewal, not local), with 1s
// leases, and the events it emitted by kind.
func recoveryEngine(t *testing.T, opts ...idem.Option) (*idem.Engine, *memstore.Store, *sync.Map) {
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	var events sync.Map // idem.EventKind → *atomic.Int64
	opts = append([]idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithLease(time.Second),
		idem.WithStoreTimeout(250 * time.Millisecond), idem.WithEventHook(func(_ context.Context, ev idem.Event) {
			n, _ := events.LoadOrStore(ev.Kind, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
		})}, opts...)
	e, err := idem.New(adaptertest.CrashableRecoverable(s), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e, s, &events
}

func count(events *sync.Map, k idem.EventKind) int64 {
	n, ok := events.Load(k)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// recoverUntil runs passes until done reports true, failing after 20s.
func recoverUntil(t *testing.T, r *idem.Recoverer, done func(idem.RecoveryReport) bool) idem.RecoveryReport {
	t.Helper()
	var sum idem.RecoveryReport
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		rep, err := r.RecoverOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		sum.Due += rep.Due
		sum.Claimed += rep.Claimed
		sum.Recovered += rep.Recovered
		sum.Deferred += rep.Deferred
		sum.Uncertain += rep.Uncertain
		if done(sum) {
			return sum
		}
		if time.Now().After(deadline) {
			t.Fatalf("recovery not done within 2 minutes: %+v", sum)
		}
	}
}

// TestRecoverDo: an idem.Do operation with Recover whose process stopped
// mid-function is run again by the function registered for its name,
// once; its journaled step replays; a later Do gets the stored result.
func TestRecoverDo(t *testing.T) {
	e, _, events := recoveryEngine(t)
	op := idem.Operation{Scope: "acct-1", Name: "send-receipt", Key: "order-7", Payload: []byte(`{"to":"a@b"}`), Recover: true}
	var runs, sends atomic.Int64
	hold := make(chan struct{})
	fn := func(ctx context.Context) (string, error) {
		n := runs.Add(1)
		id, err := idem.Step(ctx, "send", func(context.Context) (string, error) { sends.Add(1); return "msg-1", nil })
		if err != nil {
			return "", err
		}
		if n == 1 {
			<-hold // the process stops here
		}
		return id + "/sent", nil
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = idem.Do(context.Background(), e, op, fn) // its lease lapses: not ours any more
	}()
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { close(hold) })
	for deadline := time.Now().Add(2 * time.Minute); sends.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first run never ran its step")
		}
	}

	r, err := idem.NewRecoverer(e, idem.RecoverBackoff(50*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got idem.Operation
	r.Handle("send-receipt", func(ctx context.Context, op idem.Operation) error {
		got = op
		_, err := idem.Do(ctx, e, op, fn)
		return err
	})
	sum := recoverUntil(t, r, func(s idem.RecoveryReport) bool { return s.Recovered > 0 || s.Deferred > 0 })
	if sum.Recovered != 1 || sum.Claimed != 1 || runs.Load() != 2 || sends.Load() != 1 {
		t.Fatalf("recovery %+v, runs %d, sends %d; want one recovered run, the step replayed", sum, runs.Load(), sends.Load())
	}
	if got.Scope != op.Scope || got.Name != op.Name || got.Key != op.Key || string(got.Payload) != string(op.Payload) {
		t.Fatalf("the recovery function got %+v, want the operation given to Do", got)
	}
	v, err := idem.Do(context.Background(), e, op, fn)
	if err != nil || v != "msg-1/sent" || runs.Load() != 2 {
		t.Fatalf("Do after the recovery: %q %v, runs %d; want the stored result", v, err, runs.Load())
	}
	for k, want := range map[idem.EventKind]int64{idem.EventRecoveryStarted: 1, idem.EventRecovered: 1, idem.EventTakeover: 1, idem.EventRecoveryParked: 0} {
		if n := count(events, k); n != want {
			t.Errorf("%s events = %d, want %d", k, n, want)
		}
	}
	if rep, err := r.RecoverOnce(context.Background()); err != nil || rep.Due != 0 {
		t.Fatalf("a pass after the recovery: %+v, %v; want nothing due", rep, err)
	}
}

// TestRecoverParked: a record whose every recovery run fails is parked
// uncertain after the configured attempts, with its event; retries then
// get operation-uncertain and nothing runs again.
func TestRecoverParked(t *testing.T) {
	e, s, events := recoveryEngine(t)
	op := idem.Operation{Name: "always-fails", Key: "k", Recover: true}
	hold := make(chan struct{})
	var runs atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = idem.Do(context.Background(), e, op, func(context.Context) (int, error) { runs.Add(1); <-hold; return 1, nil })
	}()
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { close(hold) })
	for deadline := time.Now().Add(2 * time.Minute); runs.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first run never started")
		}
	}
	r, err := idem.NewRecoverer(e, idem.RecoverAttempts(2), idem.RecoverBackoff(10*time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r.Handle("always-fails", func(ctx context.Context, op idem.Operation) error {
		_, err := idem.Do(ctx, e, op, func(context.Context) (int, error) { runs.Add(1); return 0, errors.New("downstream down") })
		return err
	})
	sum := recoverUntil(t, r, func(s idem.RecoveryReport) bool { return s.Uncertain > 0 })
	if sum.Deferred != 2 || sum.Uncertain != 1 || runs.Load() != 3 || count(events, idem.EventRecoveryParked) != 1 {
		t.Fatalf("recovery %+v, runs %d, parked events %d; want 2 deferred runs, then parked", sum, runs.Load(), count(events, idem.EventRecoveryParked))
	}
	rec, found, err := s.Get(context.Background(), op.RecordKey())
	if err != nil || !found || rec.State != idem.StateUncertain {
		t.Fatalf("parked record: %+v %v %v; want uncertain", rec, found, err)
	}
	if _, err := idem.Do(context.Background(), e, op, func(context.Context) (int, error) { runs.Add(1); return 1, nil }); !errors.Is(err, idem.ErrUncertain) || runs.Load() != 3 {
		t.Fatalf("Do of a parked operation: %v, runs %d; want ErrUncertain, nothing run", err, runs.Load())
	}
}

// TestRecoveryNeedsRecoverableStore: recovery options on a store that
// cannot recover, a credential header, or with WithUncertainAfterCrash
// are refused by New.
func TestRecoveryNeedsRecoverableStore(t *testing.T) {
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	for name, opts := range map[string][]idem.Option{
		"store without Recoverable": {idem.WithRecovery()},
		"credential header":         {idem.WithRoute("POST", "/x", idem.RouteRecovery("authorization"))},
		"uncertain after crash":     {idem.WithRecovery(), idem.WithUncertainAfterCrash(time.Hour)},
	} {
		store := idem.Store(s)
		if name == "store without Recoverable" {
			store = adaptertest.Crashable(s)
		}
		if _, err := idem.New(store, opts...); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
	e, err := idem.New(s, idem.WithUncertainAfterCrash(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(context.Background(), e, idem.Operation{Name: "n", Key: "k", Recover: true}, func(context.Context) (int, error) { return 1, nil }); !errors.Is(err, idem.ErrNoRecovery) {
		t.Fatalf("Do with Recover under WithUncertainAfterCrash: %v, want ErrNoRecovery", err)
	}
	if _, err := idem.NewRecoverer(e); err == nil {
		t.Fatal("NewRecoverer under WithUncertainAfterCrash: accepted")
	}
}

// TestRecoverersRace: three recoverers and a client retrying, all on the
// same lapsed records: each record runs again exactly once (the store's
// Claim and Acquire are the fence), never twice at a time.
func TestRecoverersRace(t *testing.T) {
	e, _, _ := recoveryEngine(t)
	const records = 6
	hold := make(chan struct{})
	var first sync.WaitGroup
	var mu sync.Mutex
	runs := map[string]int{}
	inflight := map[string]int{}
	overlap := 0
	fn := func(key string) func(context.Context) (string, error) {
		return func(context.Context) (string, error) {
			mu.Lock()
			runs[key]++
			n := runs[key]
			if n > 1 {
				inflight[key]++
				if inflight[key] > 1 {
					overlap++
				}
			}
			mu.Unlock()
			if n == 1 {
				<-hold // the first holder stops
				return "first", nil
			}
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			inflight[key]--
			mu.Unlock()
			return "done-" + key, nil
		}
	}
	op := func(i int) idem.Operation {
		return idem.Operation{Name: "charge", Key: "k" + string(rune('a'+i)), Recover: true}
	}
	for i := range records {
		first.Add(1)
		go func() {
			defer first.Done()
			_, _ = idem.Do(context.Background(), e, op(i), fn(op(i).Key))
		}()
	}
	t.Cleanup(first.Wait)
	t.Cleanup(func() { close(hold) })
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n := len(runs)
		mu.Unlock()
		if n == records {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first runs never started")
		}
	}
	var recs []*idem.Recoverer
	for range 3 {
		r, err := idem.NewRecoverer(e, idem.RecoverBackoff(10*time.Millisecond, 50*time.Millisecond), idem.RecoverConcurrency(2))
		if err != nil {
			t.Fatal(err)
		}
		r.Handle("charge", func(ctx context.Context, o idem.Operation) error {
			_, err := idem.Do(ctx, e, o, fn(o.Key))
			return err
		})
		recs = append(recs, r)
	}
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range runs {
			if n < 2 {
				return false
			}
		}
		return true
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, r := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := r.RecoverOnce(context.Background()); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	wg.Add(1)
	go func() { // a client retrying every record
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for i := range records {
				_, _ = idem.Do(context.Background(), e, op(i), fn(op(i).Key))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	for deadline := time.Now().Add(2 * time.Minute); !done(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(300 * time.Millisecond) // let any duplicate run show
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for k, n := range runs {
		if n != 2 {
			t.Errorf("record %s ran %d times, want 2 (the stopped holder, then one takeover or recovery)", k, n)
		}
	}
	if overlap != 0 {
		t.Errorf("%d runs overlapped another run of the same record", overlap)
	}
	for i := range records {
		v, err := idem.Do(context.Background(), e, op(i), fn(op(i).Key))
		if err != nil || v != "done-"+op(i).Key {
			t.Errorf("record %d after recovery: %q %v", i, v, err)
		}
	}
}

// TestRecovererStartStop: Start runs passes in the background until Stop,
// which leaves no goroutine behind (goleak).
func TestRecovererStartStop(t *testing.T) {
	e, _, events := recoveryEngine(t)
	op := idem.Operation{Name: "bg", Key: "k", Recover: true}
	hold := make(chan struct{})
	var runs atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = idem.Do(context.Background(), e, op, func(context.Context) (int, error) { runs.Add(1); <-hold; return 1, nil })
	}()
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { close(hold) })
	r, err := idem.NewRecoverer(e, idem.RecoverEvery(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r.Handle("bg", func(ctx context.Context, o idem.Operation) error {
		_, err := idem.Do(ctx, e, o, func(context.Context) (int, error) { runs.Add(1); return 2, nil })
		return err
	})
	r.Start()
	r.Start() // no second loop
	for deadline := time.Now().Add(2 * time.Minute); count(events, idem.EventRecovered) < 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no recovery within 2 minutes (runs %d)", runs.Load())
		}
	}
	r.Stop()
	r.Stop()
	if v, err := idem.Do(context.Background(), e, op, func(context.Context) (int, error) { return 3, nil }); err != nil || v != 2 || runs.Load() != 2 {
		t.Fatalf("after the background recovery: %d %v, runs %d", v, err, runs.Load())
	}
}
