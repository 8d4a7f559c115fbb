package storetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// DefaultHistory is the number of completed recoverable records the
// RunRecovery case LapsedBehindHistory writes before its crashed record,
// unless [WithHistory] sets another.
const DefaultHistory = 10_000

// RecoveryOption configures [RunRecovery].
type RecoveryOption func(*recoveryConfig)

type recoveryConfig struct {
	history int
}

// WithHistory sets how many completed recoverable records (acquired, given
// a recovery payload, completed) the case LapsedBehindHistory writes
// before the crashed record the first Lapsed must return: n > 0. Optional.
// Default is [DefaultHistory]; a store whose writes are slow may choose
// fewer (its test says how many it can afford, and why).
func WithHistory(n int) RecoveryOption { return func(c *recoveryConfig) { c.history = n } }

// historyWorkers is how many goroutines write the history at once.
const historyWorkers = 16

// historyLimit is the limit of the Lapsed call that must find the crashed
// record: a recoverer's default batch ([idem.DefaultRecoverBatch]).
const historyLimit = idem.DefaultRecoverBatch

// testLapsedBehindHistory: a record whose holder crashed (its lease
// lapsed, never claimed) behind n completed recoverable records is
// returned by the first Lapsed(64) after its lapse, and claimed. A
// recovery index that keeps the entries of completed records (and reads
// them oldest first) hides it behind them. The history goes through the
// Store API with historyWorkers goroutines; the crashed record's lease is
// shortened after its payload is stored and Lapsed is called only once
// shortLease passed since (its lease lapsed by then, by the store's clock:
// nothing races).
func testLapsedBehindHistory(t *testing.T, s idem.Store, n int) {
	r := recoverable(t, s)
	start := time.Now()
	if err := WriteHistory(context.Background(), s, n); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d completed recoverable records written in %v", n, time.Since(start).Round(time.Millisecond))
	crashed, tok := Key(), Token()
	withRecovery(t, s, crashed, tok, fingerprint("history"), time.Hour)
	waitLapse()
	recs, err := r.Lapsed(ctx(t), historyLimit)
	if err != nil {
		t.Fatalf("Lapsed: %v", err)
	}
	if !slices.ContainsFunc(recs, func(l idem.LapsedRecord) bool { return l.Key == crashed }) {
		t.Fatalf("the first Lapsed(%d) after the crashed record's lapse returned %d records, not it: a record due behind %d completed ones must be found at once", historyLimit, len(recs), n)
	}
	if len(recs) != 1 {
		t.Errorf("Lapsed(%d) returned %d records; want the crashed one only (the history is completed)", historyLimit, len(recs))
	}
	if cl, ok, err := r.Claim(ctx(t), crashed, Token(), longLease, 0); err != nil || !ok || cl.PreviousToken != tok {
		t.Fatalf("Claim of the crashed record = %+v, %v, %v; want claimed from its holder", cl, ok, err)
	}
}

// testLapsedPastExpired: a due record behind more than limit records whose
// retain ended while they were due (expired, never claimed: entries no
// transition removed) is returned by Lapsed(limit) within one call per
// limit expired entries (a call is bounded by time): a store looks past
// what it finds expired, and never reports it.
func testLapsedPastExpired(t *testing.T, s idem.Store) {
	r := recoverable(t, s)
	const limit = 4
	fp := fingerprint("expired")
	expired := make([]string, 2*limit+1)
	for i := range expired {
		expired[i] = Key()
		withRecovery(t, s, expired[i], Token(), fp, time.Millisecond)
	}
	due, tok := Key(), Token()
	withRecovery(t, s, due, tok, fp, time.Hour)
	waitLapse() // every lease lapsed; the first records' retain ended too
	// Lapsed is bounded by time (a recoverer's pass asks again): a slow
	// store (FerretDB on a loaded machine) may end a call before its rounds
	// passed the expired entries, answering none. Up to one call per batch
	// of expired entries, each answering nothing or only the due record.
	var recs []idem.LapsedRecord
	for call := 0; call <= len(expired)/limit && len(recs) == 0; call++ {
		var err error
		if recs, err = r.Lapsed(ctx(t), limit); err != nil {
			t.Fatalf("Lapsed: %v", err)
		}
	}
	if len(recs) != 1 || recs[0].Key != due {
		t.Fatalf("Lapsed(%d) = %+v; want only the due record %s, found past %d expired ones", limit, recs, due[:8], len(expired))
	}
	if cl, ok, err := r.Claim(ctx(t), due, Token(), longLease, 0); err != nil || !ok || cl.PreviousToken != tok {
		t.Fatalf("Claim of the due record = %+v, %v, %v; want claimed from its holder", cl, ok, err)
	}
}

// WriteHistory writes n completed recoverable records to s (an
// [idem.Recoverable]) through the Store API, as a service's history of
// finished executions: each acquired under a fresh key, given a recovery
// payload, and completed, from 16 goroutines at once. It returns the
// first error, within at most 10 minutes.
func WriteHistory(ctx context.Context, s idem.Store, n int) error {
	r, ok := s.(idem.Recoverable)
	if !ok {
		return fmt.Errorf("%T does not implement idem.Recoverable", s)
	}
	c, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		werr    error
	)
	fail := func(err error) {
		errOnce.Do(func() { werr = err; cancel() })
	}
	for range historyWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) && c.Err() == nil {
				if err := writeHistoryRecord(c, s, r, Key()); err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if werr == nil {
		werr = ctx.Err()
	}
	return werr
}

// WriteHistoryRecord writes one completed recoverable record to s (an
// [idem.Recoverable]) through the Store API, exactly as [WriteHistory]
// writes each (the same fingerprint, recovery payload, response and
// retention: 1h), under a fresh key, which it returns: the template a
// store's bulk copy of a history clones (tools/history).
func WriteHistoryRecord(ctx context.Context, s idem.Store) (key string, err error) {
	r, ok := s.(idem.Recoverable)
	if !ok {
		return "", fmt.Errorf("%T does not implement idem.Recoverable", s)
	}
	key = Key()
	return key, writeHistoryRecord(ctx, s, r, key)
}

// writeHistoryRecord acquires key under a fresh token, gives it a
// recovery payload and completes it.
func writeHistoryRecord(ctx context.Context, s idem.Store, r idem.Recoverable, key string) error {
	tok := Token()
	if _, ok, err := s.Acquire(ctx, key, tok, fingerprint("history"), longLease); err != nil || !ok {
		return fmt.Errorf("history: Acquire of a fresh key: %v, %w", ok, err)
	}
	if err := r.SetRecovery(ctx, key, tok, payloadOf("history"), time.Hour, longLease); err != nil {
		return fmt.Errorf("history: SetRecovery: %w", err)
	}
	if err := s.Complete(ctx, key, tok, sampleResponse(), retention); err != nil {
		return fmt.Errorf("history: Complete: %w", err)
	}
	return nil
}

// PassesUntilLapsed measures what a recoverer meets behind a store's
// history: it leaves one crashed record in s (acquired, given a recovery
// payload, its lease shortened to lease through [idem.Extender]), waits
// lease, then calls Lapsed(limit) until it returns that record (at most
// maxPasses calls). It returns how many records the first call returned,
// the calls made (passes: 1 when the first found it), and how long the
// calls took in all. The crashed record is claimed at the end.
func PassesUntilLapsed(ctx context.Context, s idem.Store, limit, maxPasses int, lease time.Duration) (first, passes int, took time.Duration, err error) {
	r, ok := s.(idem.Recoverable)
	ext, ok2 := s.(idem.Extender)
	if !ok || !ok2 {
		return 0, 0, 0, fmt.Errorf("%T does not implement idem.Recoverable and idem.Extender", s)
	}
	key, tok, fp := Key(), Token(), fingerprint("history")
	// An hour's lease until it is shortened: a store whose writes slow down
	// with its history (the FerretDB test server) stores the payload long
	// after the Acquire.
	if _, ok, err := s.Acquire(ctx, key, tok, fp, time.Hour); err != nil || !ok {
		return 0, 0, 0, fmt.Errorf("Acquire: %v, %w", ok, err)
	}
	if err := r.SetRecovery(ctx, key, tok, payloadOf(key), time.Hour, longLease); err != nil {
		return 0, 0, 0, fmt.Errorf("SetRecovery: %w", err)
	}
	if err := ext.Extend(ctx, key, tok, lease); err != nil {
		return 0, 0, 0, fmt.Errorf("Extend: %w", err)
	}
	time.Sleep(lease + 100*time.Millisecond)
	start := time.Now()
	for passes = 1; passes <= maxPasses; passes++ {
		recs, err := r.Lapsed(ctx, limit)
		if err != nil {
			return first, passes, time.Since(start), err
		}
		if passes == 1 {
			first = len(recs)
		}
		if slices.ContainsFunc(recs, func(l idem.LapsedRecord) bool { return l.Key == key }) {
			took = time.Since(start)
			_, _, err := r.Claim(ctx, key, Token(), longLease, 0)
			return first, passes, took, err
		}
	}
	return first, passes - 1, time.Since(start), fmt.Errorf("the crashed record was not found in %d passes", maxPasses)
}
