package memstore_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
)

// crashOps leaves n recoverable Do operations named name crashed in e (each
// holding its record in its function until the test ends, its lease not
// renewed), and returns once store reports all n due.
func crashOps(t *testing.T, e *idem.Engine, store idem.Recoverable, name string, n int) []idem.Operation {
	t.Helper()
	hold := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { close(hold) })
	var started atomic.Int64
	ops := make([]idem.Operation, n)
	for i := range ops {
		ops[i] = idem.Operation{Name: name, Key: "k" + strconv.Itoa(i), Recover: true}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = idem.Do(context.Background(), e, ops[i], func(context.Context) (int, error) { started.Add(1); <-hold; return 0, nil })
		}()
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		due, err := store.Lapsed(context.Background(), 10*n)
		if err != nil {
			t.Fatal(err)
		}
		if started.Load() == int64(n) && len(due) == n {
			return ops
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d operations started, %d due, within 2 minutes", started.Load(), n, len(due))
		}
	}
}

// passEngine returns an engine over store (1s leases)
// whose recoverer passes are reported to passes, and its log.
func passEngine(t *testing.T, store idem.Store, passes *[]idem.RecoveryReport, opts ...idem.Option) (*idem.Engine, *syncBuffer) {
	var mu sync.Mutex
	logs := &syncBuffer{}
	opts = append([]idem.Option{idem.WithLogger(slog.New(slog.NewTextHandler(logs, nil))), idem.WithLease(time.Second),
		idem.WithStoreTimeout(250 * time.Millisecond), idem.WithEventHook(func(_ context.Context, ev idem.Event) {
			if ev.Kind == idem.EventRecoveryPass {
				mu.Lock()
				*passes = append(*passes, *ev.Pass)
				mu.Unlock()
			}
		})}, opts...)
	e, err := idem.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e, logs
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestRecoverPassSeesEveryDue: one pass with a batch of 2 claims and
// recovers all 5 due records (it asks again while batches come full),
// and reports what it did as an EventRecoveryPass.
func TestRecoverPassSeesEveryDue(t *testing.T) {
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	store := adaptertest.CrashableRecoverable(s)
	var passes []idem.RecoveryReport
	e, _ := passEngine(t, store, &passes)
	crashOps(t, e, store.(idem.Recoverable), "charge", 5)
	r, err := idem.NewRecoverer(e, idem.RecoverBatch(2), idem.RecoverEvery(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	r.Handle("charge", func(ctx context.Context, op idem.Operation) error {
		_, err := idem.Do(ctx, e, op, func(context.Context) (int, error) { return 1, nil })
		return err
	})
	rep, err := r.RecoverOnce(context.Background())
	if err != nil || rep.Due != 5 || rep.Claimed != 5 || rep.Recovered != 5 || rep.Deferred != 0 || rep.Parked != 0 {
		t.Fatalf("one pass with batch 2 over 5 due records = %+v, %v; want all 5 seen, claimed and recovered", rep, err)
	}
	if rep.OldestDue <= 0 {
		t.Errorf("OldestDue = %v; want > 0 (the records were due when claimed)", rep.OldestDue)
	}
	if len(passes) != 1 || passes[0] != rep {
		t.Fatalf("pass events %+v; want one, %+v", passes, rep)
	}
}

// refusingStore answers Lapsed from the store it wraps but never claims:
// a store whose Lapsed and Claim disagree.
type refusingStore struct {
	idem.Store
	idem.Journal
	idem.Recoverable
}

func (refusingStore) Claim(context.Context, string, string, time.Duration, time.Duration) (idem.RecoveryClaim, bool, error) {
	return idem.RecoveryClaim{}, false, nil
}

// TestRecoverClaimWarning: a due record whose claims fail pass after pass
// is logged as a warning once every third failed claim, naming its key.
func TestRecoverClaimWarning(t *testing.T) {
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	crashable := adaptertest.CrashableRecoverable(s)
	var passes []idem.RecoveryReport
	e, _ := passEngine(t, crashable, &passes)
	ops := crashOps(t, e, crashable.(idem.Recoverable), "charge", 1)
	refusing := refusingStore{Store: crashable, Journal: crashable.(idem.Journal), Recoverable: crashable.(idem.Recoverable)}
	e2, logs := passEngine(t, refusing, &passes)
	r, err := idem.NewRecoverer(e2)
	if err != nil {
		t.Fatal(err)
	}
	const warning = "could not be claimed pass after pass"
	for pass := 1; pass <= 3; pass++ {
		rep, err := r.RecoverOnce(context.Background())
		if err != nil || rep.Due != 1 || rep.Claimed != 0 {
			t.Fatalf("pass %d = %+v, %v; want the record seen, not claimed", pass, rep, err)
		}
		if got := strings.Count(logs.String(), warning); got != pass/3 {
			t.Fatalf("after %d failed claims: %d warnings; want %d\n%s", pass, got, pass/3, logs)
		}
	}
	if key := ops[0].RecordKey(); !strings.Contains(logs.String(), key[:16]) {
		t.Fatalf("the warning does not name the record %s:\n%s", key[:16], logs)
	}
}

// leaseStore records the leases of SetRecovery, Claim and Extend calls
// once recording is on (before, Extend fails: the crashed holder's
// renewals are lost), and, for a claim, the lease the claimed record holds
// by the store (read through mem).
type leaseStore struct {
	idem.Store
	idem.Journal
	idem.Recoverable
	mem    *memstore.Store
	on     atomic.Bool
	mu     sync.Mutex
	leases []string
}

func (l *leaseStore) note(s string) {
	l.mu.Lock()
	l.leases = append(l.leases, s)
	l.mu.Unlock()
}

func (l *leaseStore) Claim(ctx context.Context, key, token string, lease, backoff time.Duration) (idem.RecoveryClaim, bool, error) {
	c, ok, err := l.Recoverable.Claim(ctx, key, token, lease, backoff)
	if ok {
		info, _, _ := l.mem.Inspect(ctx, key)
		l.note(fmt.Sprintf("claim holding %v", info.TTL.Round(time.Minute)))
	}
	return c, ok, err
}

func (l *leaseStore) SetRecovery(ctx context.Context, key, token string, payload []byte, retain, lease time.Duration) error {
	l.note("setrecovery " + lease.String())
	return l.Recoverable.SetRecovery(ctx, key, token, payload, retain, lease)
}

func (l *leaseStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if !l.on.Load() {
		return idem.ErrNotOwner
	}
	l.note("extend " + lease.String())
	return l.Store.(idem.Extender).Extend(ctx, key, token, lease)
}

// TestRecoverRouteLease: a recovery claim holds the lease of the record's
// own route (here the engine's 1s, where another route takes 1 minute),
// not the longest of any route, from the claim itself on (the lease
// SetRecovery kept with the payload: no Extend follows the claim), before
// the run starts. The claimed record's lease left (Inspect's TTL), read right after the
// claim and rounded to the minute, is 0 (at most 1s), never the 1 minute
// of the longest route.
func TestRecoverRouteLease(t *testing.T) {
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	crashable := adaptertest.CrashableRecoverable(s)
	ls := &leaseStore{Store: crashable, Journal: crashable.(idem.Journal), Recoverable: crashable.(idem.Recoverable), mem: s}
	ls.Store = extendable{crashable, s}
	var passes []idem.RecoveryReport
	e, _ := passEngine(t, ls, &passes, idem.WithRoute("POST", "/slow", idem.RouteLease(time.Minute)))
	crashOps(t, e, ls, "charge", 1)
	ls.on.Store(true)
	r, err := idem.NewRecoverer(e)
	if err != nil {
		t.Fatal(err)
	}
	r.Handle("charge", func(ctx context.Context, op idem.Operation) error {
		_, err := idem.Do(ctx, e, op, func(context.Context) (int, error) { ls.note("run"); return 1, nil })
		return err
	})
	if rep, err := r.RecoverOnce(context.Background()); err != nil || rep.Recovered != 1 {
		t.Fatalf("pass = %+v, %v; want the record recovered", rep, err)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if len(ls.leases) < 3 || ls.leases[0] != "setrecovery 1s" || ls.leases[1] != "claim holding 0s" || ls.leases[2] != "run" {
		t.Fatalf("leases %v; want the payload stored with the route's 1s lease, the claim holding it (less than half a minute left), then the run, no Extend between", ls.leases)
	}
}

// extendable is a crashable store that is an Extender again (through
// leaseStore, which decides when it works).
type extendable struct {
	idem.Store
	mem *memstore.Store
}

func (x extendable) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	return x.mem.Extend(ctx, key, token, lease)
}
