package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// RunDo checks [idem.Do] on the real store: a duplicate gets the stored
// result, concurrent duplicates run the function once, a reused key with
// another payload is refused, a transient error releases the key while a
// permanent one is stored, a panic releases the key, and an execution that
// crashed (its lease never renewed nor completed) is taken over once its
// lease lapses, or, under [idem.WithUncertainAfterCrash], is refused until
// resolved; a spent key under [idem.WithTombstones] is refused.
// newStore is called once per subtest, as for [Run].
func RunDo(t *testing.T, newStore func(t *testing.T) idem.Store) {
	tests := []storeCase{
		{"DuplicateGetsStoredResult", testDoDuplicate},
		{"ConcurrentDuplicatesRunOnce", testDoConcurrent},
		{"Mismatch", testDoMismatch},
		{"TransientErrorReleases", testDoTransient},
		{"PermanentErrorStored", testDoPermanent},
		{"PanicReleases", testDoPanic},
		{"TakeoverAfterCrash", testDoTakeover},
		{"BytesCodec", testDoBytes},
		{"KeyExpired", testDoKeyExpired},
		{"UncertainAfterCrash", testDoUncertain},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newStore(t)) })
	}
}

// crashedLease is the lease left by the crashed process of the takeover test.
const crashedLease = time.Second

func doEngine(t *testing.T, s idem.Store, opts ...idem.Option) *idem.Engine {
	t.Helper()
	e, err := idem.New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Close(ctx)
	})
	return e
}

func doOp(payload string) idem.Operation {
	return idem.Operation{Scope: "storetest", Name: "charge", Key: Key(), Payload: []byte(payload)}
}

type receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func testDoDuplicate(t *testing.T, s idem.Store) {
	e := doEngine(t, s)
	op := doOp("p1")
	var runs atomic.Int32
	fn := func(ctx context.Context) (receipt, error) {
		if info, ok := idem.InfoFromContext(ctx); !ok || info.Key == "" {
			t.Errorf("fn's context carries no execution: %+v %v", info, ok)
		}
		return receipt{ID: fmt.Sprint("r", runs.Add(1)), Amount: 42}, nil
	}
	for i := range 3 {
		got, err := idem.Do(context.Background(), e, op, fn)
		if err != nil || got != (receipt{ID: "r1", Amount: 42}) {
			t.Fatalf("call %d: %+v, %v; want the first result", i, got, err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	other := op
	other.Name = "refund" // another operation, same key: its own record
	if _, err := idem.Do(context.Background(), e, other, fn); err != nil || runs.Load() != 2 {
		t.Fatalf("another operation with the same key: err %v, runs %d; want a second run", err, runs.Load())
	}
}

func testDoConcurrent(t *testing.T, s idem.Store) {
	e := doEngine(t, s, idem.WithWait(30*time.Second))
	op := doOp("p1")
	var runs atomic.Int32
	release := make(chan struct{})
	fn := func(context.Context) (int, error) {
		n := runs.Add(1)
		<-release
		return int(n), nil
	}
	const callers = 8
	var wg sync.WaitGroup
	results := make(chan int, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := idem.Do(context.Background(), e, op, fn)
			if err != nil {
				t.Errorf("Do: %v", err)
			}
			results <- v
		}()
	}
	for runs.Load() == 0 { // one runs; the others wait (WithWait)
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(results)
	for v := range results {
		if v != 1 {
			t.Errorf("a caller got %d, want 1 (the one run's result)", v)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	// Without WithWait a duplicate during the run gets ErrInProgress.
	e2 := doEngine(t, s)
	op2 := doOp("p2")
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idem.Do(context.Background(), e2, op2, func(context.Context) (int, error) {
			close(started)
			<-finish
			return 1, nil
		})
		done <- err
	}()
	<-started
	if _, err := idem.Do(context.Background(), e2, op2, fn); !errors.Is(err, idem.ErrInProgress) {
		t.Errorf("duplicate during the run: %v, want ErrInProgress", err)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func testDoMismatch(t *testing.T, s idem.Store) {
	e := doEngine(t, s)
	op := doOp("p1")
	if _, err := idem.Do(context.Background(), e, op, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	op.Payload = []byte("p2")
	_, err := idem.Do(context.Background(), e, op, func(context.Context) (int, error) {
		t.Error("fn ran for a reused key with another payload")
		return 2, nil
	})
	if !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("got %v, want ErrMismatch", err)
	}
}

func testDoTransient(t *testing.T, s idem.Store) {
	e := doEngine(t, s)
	op := doOp("p1")
	boom := errors.New("smtp timeout")
	if _, err := idem.Do(context.Background(), e, op, func(context.Context) (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("got %v, want fn's error", err)
	}
	v, err := idem.Do(context.Background(), e, op, func(context.Context) (int, error) { return 7, nil })
	if err != nil || v != 7 {
		t.Fatalf("retry after a transient error: %v, %v; want a second run", v, err)
	}
}

func testDoPermanent(t *testing.T, s idem.Store) {
	e := doEngine(t, s)
	op := doOp("p1")
	invalid := errors.New("payment 12 has no customer")
	_, err := idem.Do(context.Background(), e, op, func(context.Context) (int, error) { return 0, idem.Permanent(invalid) })
	if !errors.Is(err, invalid) || !errors.Is(err, idem.ErrPermanent) {
		t.Fatalf("first call: %v, want the permanent error", err)
	}
	_, err = idem.Do(context.Background(), e, op, func(context.Context) (int, error) {
		t.Error("fn ran again after a permanent error")
		return 1, nil
	})
	var stored *idem.StoredError
	if !errors.As(err, &stored) || stored.Message != invalid.Error() || !errors.Is(err, idem.ErrPermanent) ||
		!errors.Is(err, &idem.StoredError{Message: invalid.Error()}) {
		t.Fatalf("duplicate: %v (%T), want a StoredError %q", err, err, invalid)
	}
}

func testDoPanic(t *testing.T, s idem.Store) {
	e := doEngine(t, s)
	op := doOp("p1")
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want the panic to go on", r)
			}
		}()
		_, _ = idem.Do(context.Background(), e, op, func(context.Context) (int, error) { panic("boom") })
	}()
	v, err := idem.Do(context.Background(), e, op, func(context.Context) (int, error) { return 3, nil })
	if err != nil || v != 3 {
		t.Fatalf("after a panic: %v, %v; want a second run", v, err)
	}
}

// testDoTakeover plays a process that acquired the key and died: its lease
// is in the store, never renewed nor completed. Duplicates get
// ErrInProgress until it lapses, then one of them runs.
func testDoTakeover(t *testing.T, s idem.Store) {
	e := doEngine(t, s)
	op := doOp("p1")
	key := idem.ScopedKey(op.Scope, "(do)", op.Name, op.Key)
	fp := idem.Fingerprint("(do)", op.Name, "", "", op.Payload)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, acquired, err := s.Acquire(ctx, key, "crashed-process", fp, crashedLease); err != nil || !acquired {
		t.Fatalf("Acquire as the crashed process: %v %v", acquired, err)
	}
	var runs atomic.Int32
	fn := func(context.Context) (int, error) { return int(runs.Add(1)), nil }
	if _, err := idem.Do(ctx, e, op, fn); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("while the crashed lease lives: %v, want ErrInProgress", err)
	}
	for {
		v, err := idem.Do(ctx, e, op, fn)
		if err == nil {
			if v != 1 || runs.Load() != 1 {
				t.Fatalf("takeover: %d, runs %d; want one run", v, runs.Load())
			}
			break
		}
		if !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("waiting for the takeover: %v", err)
		}
		if ctx.Err() != nil {
			t.Fatal("the crashed lease never lapsed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.Complete(ctx, key, "crashed-process", sampleResponse(), time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("the crashed process completing after the takeover: %v, want ErrNotOwner", err)
	}
}

func testDoBytes(t *testing.T, s idem.Store) {
	e := doEngine(t, s)
	op := doOp("p1")
	op.Codec = idem.BytesCodec
	want := []byte{0, 1, 2, 0xff, '\n'}
	for range 2 {
		got, err := idem.Do(context.Background(), e, op, func(context.Context) ([]byte, error) { return want, nil })
		if err != nil || string(got) != string(want) {
			t.Fatalf("got %q, %v; want %q", got, err, want)
		}
	}
}

// testDoKeyExpired: under WithTombstones, a duplicate after the retention
// gets ErrKeyExpired, and the function does not run again.
func testDoKeyExpired(t *testing.T, s idem.Store) {
	if _, ok := s.(idem.Keeper); !ok {
		t.Skip("store does not implement idem.Keeper")
	}
	e := doEngine(t, s, idem.WithRetention(shortLease), idem.WithTombstones(longLease))
	op := doOp(`{"amount":1}`)
	var runs atomic.Int32
	fn := func(context.Context) (receipt, error) { runs.Add(1); return receipt{ID: "r1", Amount: 1}, nil }
	if _, err := idem.Do(ctx(t), e, op, fn); err != nil {
		t.Fatalf("first Do: %v", err)
	}
	time.Sleep(shortLease + 200*time.Millisecond)
	if _, err := idem.Do(ctx(t), e, op, fn); !errors.Is(err, idem.ErrKeyExpired) {
		t.Fatalf("Do after the retention = %v; want ErrKeyExpired", err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times; want 1", n)
	}
}

// testDoUncertain: under WithUncertainAfterCrash, the record of a crashed
// process is refused with ErrInProgress while its lease lives, then with
// ErrUncertain, and fn never runs; once an operator releases it
// (Keeper.Resolve), the next call runs fn once.
func testDoUncertain(t *testing.T, s idem.Store) {
	k, ok := s.(idem.Keeper)
	if !ok {
		t.Skip("store does not implement idem.Keeper")
	}
	e := doEngine(t, s, idem.WithUncertainAfterCrash(longLease))
	op := doOp("p1")
	key := idem.ScopedKey(op.Scope, "(do)", op.Name, op.Key)
	fp := idem.Fingerprint("(do)", op.Name, "", "", op.Payload)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, acquired, err := k.AcquireKeep(ctx, key, "crashed-process", fp, crashedLease, idem.Keep{Uncertain: longLease}); err != nil || !acquired {
		t.Fatalf("AcquireKeep as the crashed process: %v %v", acquired, err)
	}
	var runs atomic.Int32
	fn := func(context.Context) (int, error) { return int(runs.Add(1)), nil }
	for {
		_, err := idem.Do(ctx, e, op, fn)
		if errors.Is(err, idem.ErrUncertain) {
			break
		}
		if !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("while the crashed lease lives: %v, want ErrInProgress, then ErrUncertain", err)
		}
		if ctx.Err() != nil {
			t.Fatal("the crashed lease never lapsed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := idem.Do(ctx, e, op, fn); !errors.Is(err, idem.ErrUncertain) || runs.Load() != 0 {
		t.Fatalf("again: %v, runs %d; want ErrUncertain and no run", err, runs.Load())
	}
	if err := k.Resolve(ctx, key, nil, 0); err != nil {
		t.Fatalf("Resolve (release): %v", err)
	}
	if v, err := idem.Do(ctx, e, op, fn); err != nil || v != 1 || runs.Load() != 1 {
		t.Fatalf("after the release: %d, %v, runs %d; want one run", v, err, runs.Load())
	}
}
