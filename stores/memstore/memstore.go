// Package memstore is an in-memory [idem.Store] for a single process: tests,
// development, and services that run one instance. Records live in sharded
// maps; expiry is checked on every read and a janitor goroutine, stopped by
// [Store.Close], deletes expired records and shrinks the maps so memory
// returns to baseline after retention.
//
// The store implements [idem.Keeper]: tombstones ([idem.WithTombstones])
// free their response when the retention ends (on the next read or
// cleanup); measured over 20,000 records (TestTombstoneMemory), a record
// with a 200-byte response takes about 380 bytes of heap and its tombstone
// about 170, plus the key's and fingerprint's 64-byte strings. Uncertain
// records ([idem.WithUncertainAfterCrash]) never arise through an engine:
// its memstore leases end with the process, never by lapsing.
//
// It implements [idem.Inspector] and [idem.Lister] too, for operators'
// tools in the process (observability/idemui's console).
//
// The store is an [idem.Recoverable]: each shard keeps the set of its
// records with a recovery payload (in flight or due; Complete, Release,
// Resolve and expiry take theirs out), and [Store.Lapsed] scans those
// sets, never the completed records; [Store.Claim] is one map lookup.
//
// With several instances behind a load balancer use a shared store
// (redisstore, mongostore): a memstore only protects its own process.
package memstore

import (
	"context"
	"errors"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	idem "github.com/idemkit/idem/core"
)

// ErrFull is returned by Acquire when the store holds MaxRecords live
// records; the engine answers 503. Live records are never evicted.
var ErrFull = errors.New("memstore: record limit reached")

// Defaults of the options.
const (
	DefaultMaxRecords      = 1_000_000
	DefaultCleanupInterval = time.Minute
)

const numShards = 64

var _ idem.Store = (*Store)(nil)
var _ idem.Extender = (*Store)(nil)
var _ idem.LocalStore = (*Store)(nil)
var _ idem.Keeper = (*Store)(nil)
var _ idem.Journal = (*Store)(nil)
var _ idem.Recoverable = (*Store)(nil)
var _ idem.StepResolver = (*Store)(nil)

// Store is an in-memory idem.Store, safe for concurrent use.
type Store struct {
	shards   [numShards]shard
	seed     maphash.Seed // of the shard hash
	now      func() time.Time
	max      int64
	count    atomic.Int64
	interval time.Duration

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type shard struct {
	mu   sync.Mutex
	m    map[string]*entry
	peak int
	// recov holds the keys of the shard's records given a recovery payload
	// (SetRecovery) that may still hold it: Complete, Release, Resolve and
	// Cleanup remove theirs, Lapsed the others it meets (taken over by
	// another fingerprint's request, evicted). Lapsed scans it, not m: its
	// cost is the records in flight with a payload and the due ones, never
	// the completed ones.
	recov map[string]struct{}
	_     [32]byte // keep shards on separate cache lines
}

type entry struct {
	state   idem.State // StateInProgress or StateCompleted; the others are derived from until
	token   string
	fp      string
	resp    []byte    // completed: the response (a copy; few pointers for the GC to scan); nil once until passed
	until   time.Time // end of the lease (in-progress) or of retention (completed)
	expires time.Time // until plus the record's keep (or retain): when the record is gone
	keep    idem.Keep
	retain  time.Duration    // how long a lapsed in-progress record with a journal is kept (idem.Journal.StartStep)
	steps   []idem.StepEntry // the step journal; replaced, never edited in place

	payload  []byte        // the recovery payload (idem.Recoverable.SetRecovery), a copy; nil: none
	rlease   time.Duration // the lease a recovery claim takes, kept with the payload
	attempts int           // recovery claims (idem.Recoverable.Claim)
	backoff  time.Duration // how long after its lease lapsed the record is due for recovery again
}

// stateAt returns the entry's state at now, for a live entry: past until,
// an in-progress record is uncertain (under Keep.Uncertain) or lapsed and
// kept for its journal (still in progress, to be taken over), and a
// completed one expired (kept only under a Keep, else expires == until).
func (e *entry) stateAt(now time.Time) idem.State {
	if now.Before(e.until) {
		return e.state
	}
	if e.state == idem.StateInProgress {
		if e.keep.Uncertain > 0 {
			return idem.StateUncertain
		}
		return idem.StateInProgress
	}
	return idem.StateExpired
}

// lapse returns how long an in-progress e outlives its lease end: its
// Keep.Uncertain, else its journal's retain.
func (e *entry) lapse() time.Duration {
	if e.keep.Uncertain > 0 {
		return e.keep.Uncertain
	}
	return e.retain
}

// Option configures a Store.
type Option func(*Store)

// WithClock sets the clock used for leases and retention. Optional. Default is time.Now.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithMaxRecords bounds the number of live records; Acquire of a new key
// beyond it returns [ErrFull]. Optional. Default is 1,000,000.
func WithMaxRecords(n int) Option { return func(s *Store) { s.max = int64(n) } }

// WithCleanupInterval sets how often the janitor deletes expired records;
// 0 starts no janitor (expired records are then only replaced, never freed).
// Optional. Default is 1 minute.
func WithCleanupInterval(d time.Duration) Option { return func(s *Store) { s.interval = d } }

// New returns a Store and starts its janitor; call Close to stop it.
func New(opts ...Option) *Store {
	s := &Store{now: time.Now, seed: maphash.MakeSeed(), max: DefaultMaxRecords, interval: DefaultCleanupInterval,
		stop: make(chan struct{}), done: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
	}
	if s.interval > 0 {
		go s.janitor()
	} else {
		close(s.done)
	}
	return s
}

// Close stops the janitor and waits for it. The store stays usable. It is
// safe to call more than once and always returns nil.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// Len returns the number of records held, expired ones not yet deleted included.
func (s *Store) Len() int { return int(s.count.Load()) }

func (s *Store) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)%numShards]
}

// live returns the entry for key if it has not expired; sh.mu must be held.
func (sh *shard) live(key string, now time.Time) *entry {
	e := sh.m[key]
	if e == nil || !now.Before(e.expires) {
		return nil
	}
	return e
}

// Local implements [idem.LocalStore]: records live in this process's
// memory only, and calls do no I/O.
func (s *Store) Local() bool { return true }

// Acquire implements [idem.Store.Acquire]. A completed record's Response
// is the stored bytes themselves, not a copy: they are never modified
// (Complete replaces them) and, as [idem.Store] says, read-only for the
// caller.
func (s *Store) Acquire(ctx context.Context, key, token, fingerprint string, lease time.Duration) (idem.Record, bool, error) {
	return s.AcquireKeep(ctx, key, token, fingerprint, lease, idem.Keep{})
}

// AcquireKeep implements [idem.Keeper.AcquireKeep], with Acquire's
// Response rule.
func (s *Store) AcquireKeep(ctx context.Context, key, token, fingerprint string, lease time.Duration, keep idem.Keep) (idem.Record, bool, error) {
	live, state, now, acquired, err := s.acquire(ctx, key, token, fingerprint, lease, keep)
	if err != nil {
		return idem.Record{}, false, err
	}
	if acquired {
		if live.token == "" { // a new record
			return idem.Record{}, true, nil
		}
		return idem.Record{State: idem.StateInProgress, Token: live.token, LeaseLeft: min(live.until.Sub(now), -1)}, true, nil
	}
	rec := idem.Record{State: state, Fingerprint: live.fp, Token: live.token}
	switch state {
	case idem.StateInProgress:
		rec.LeaseLeft = max(live.until.Sub(now), 1) // live: until is after the read
	case idem.StateCompleted:
		rec.Response = live.resp
	case idem.StateExpired:
		rec.Token = ""
	}
	return rec, false, nil
}

// acquire takes the lease, or returns a copy of the live entry with its
// state at the time of the read. Acquired, it returns the in-progress
// entry whose lapsed lease it took over (its token and lease end), or a
// zero entry.
func (s *Store) acquire(ctx context.Context, key, token, fingerprint string, lease time.Duration, keep idem.Keep) (entry, idem.State, time.Time, bool, error) {
	if err := ctx.Err(); err != nil {
		return entry{}, 0, time.Time{}, false, err
	}
	if lease <= 0 || keep.Uncertain < 0 || keep.Tombstone < 0 {
		return entry{}, 0, time.Time{}, false, idem.ErrInvalidDuration
	}
	sh := s.shard(key)
	sh.mu.Lock()
	now := s.now()
	e, ok := sh.m[key]
	held := ok && now.Before(e.expires) && e.state == idem.StateInProgress && !now.Before(e.until) && e.keep.Uncertain == 0
	if ok && now.Before(e.expires) && (!held || e.fp != fingerprint && (len(e.steps) > 0 || e.payload != nil)) {
		state := e.stateAt(now)
		if state == idem.StateExpired {
			e.resp = nil // free the response now that only the tombstone is kept
		}
		live := *e
		sh.mu.Unlock()
		return live, state, now, false, nil
	}
	defer sh.mu.Unlock()
	if !ok {
		if s.count.Load() >= s.max {
			return entry{}, 0, time.Time{}, false, ErrFull
		}
		s.count.Add(1)
		e = &entry{}
		sh.m[key] = e
		if len(sh.m) > sh.peak {
			sh.peak = len(sh.m)
		}
	}
	var prev entry
	if ok && e.state == idem.StateInProgress {
		prev = entry{token: e.token, until: e.until}
	}
	n := entry{state: idem.StateInProgress, token: token, fp: fingerprint, until: now.Add(lease), keep: keep}
	if held && e.fp == fingerprint { // resume: the journal, its retain and the recovery payload go on
		n.steps, n.retain = e.steps, e.retain
		n.payload, n.rlease, n.attempts, n.backoff = e.payload, e.rlease, e.attempts, e.backoff
	}
	n.expires = n.until.Add(n.lapse())
	*e = n
	return prev, 0, now, true, nil
}

// owned returns the entry if token holds its live lease, or owns it while
// it is uncertain ([idem.Keep.Uncertain]); sh.mu must be held.
func (sh *shard) owned(key, token string, now time.Time) *entry {
	e := sh.live(key, now)
	if e == nil || e.state != idem.StateInProgress || e.token != token || e.keep.Uncertain == 0 && !now.Before(e.until) {
		return nil
	}
	return e
}

// Complete implements [idem.Store.Complete].
func (s *Store) Complete(ctx context.Context, key, token string, response []byte, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if retention <= 0 {
		return idem.ErrInvalidDuration
	}
	stored := slices.Clone(response) // copy outside the lock
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e := sh.owned(key, token, now)
	if e == nil {
		return idem.ErrNotOwner
	}
	e.complete(stored, now, retention)
	delete(sh.recov, key)
	return nil
}

// complete marks e completed with resp for retention from now, and its
// tombstone after it.
func (e *entry) complete(resp []byte, now time.Time, retention time.Duration) {
	e.state, e.resp, e.token, e.payload = idem.StateCompleted, resp, "", nil
	e.until = now.Add(retention)
	e.expires = e.until.Add(e.keep.Tombstone)
}

// Resolve implements [idem.Keeper.Resolve].
func (s *Store) Resolve(ctx context.Context, key string, response []byte, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if response != nil && retention <= 0 {
		return idem.ErrInvalidDuration
	}
	stored := slices.Clone(response)
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e := sh.live(key, now)
	if e == nil || e.stateAt(now) != idem.StateUncertain {
		return idem.ErrRecordChanged
	}
	delete(sh.recov, key)
	if response == nil {
		delete(sh.m, key)
		s.count.Add(-1)
		return nil
	}
	e.complete(stored, now, retention)
	return nil
}

// Release implements [idem.Store.Release].
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.owned(key, token, s.now()) == nil {
		return idem.ErrNotOwner
	}
	delete(sh.m, key)
	delete(sh.recov, key)
	s.count.Add(-1)
	return nil
}

// Extend implements [idem.Extender].
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if lease <= 0 {
		return idem.ErrInvalidDuration
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e := sh.owned(key, token, now)
	if e == nil {
		return idem.ErrNotOwner
	}
	e.until = now.Add(lease)
	e.expires = e.until.Add(e.lapse())
	return nil
}

// Get implements [idem.Store.Get]; a completed record's Response is a copy.
func (s *Store) Get(ctx context.Context, key string) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	now := s.now()
	e := sh.live(key, now)
	if e == nil {
		sh.mu.Unlock()
		return idem.Record{}, false, nil
	}
	live, state := *e, e.stateAt(now)
	sh.mu.Unlock()
	rec := idem.Record{State: state, Fingerprint: live.fp, Token: live.token}
	if state == idem.StateCompleted {
		rec.Response = slices.Clone(live.resp)
	}
	return rec, true, nil
}

// Cleanup deletes expired records now, frees the responses of tombstones
// ([idem.Keep.Tombstone]), and shrinks maps that fell below a
// quarter of their peak, returning the number deleted. The janitor calls it
// every cleanup interval.
func (s *Store) Cleanup() int {
	deleted := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		for k, e := range sh.m {
			switch {
			case !now.Before(e.expires):
				delete(sh.m, k)
				delete(sh.recov, k)
				deleted++
			case e.resp != nil && !now.Before(e.until):
				e.resp = nil // a tombstone keeps no response
			}
		}
		// Go maps never give buckets back; rebuild a map that shrank a lot.
		if sh.peak > 1024 && len(sh.m) < sh.peak/4 {
			m := make(map[string]*entry, len(sh.m))
			for k, e := range sh.m {
				m[k] = e
			}
			sh.m, sh.peak = m, len(m)
		}
		sh.mu.Unlock()
	}
	s.count.Add(-int64(deleted))
	return deleted
}

func (s *Store) janitor() {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Cleanup()
		}
	}
}

// leased returns the entry if token holds its live lease; sh.mu must be held.
func (sh *shard) leased(key, token string, now time.Time) *entry {
	e := sh.owned(key, token, now)
	if e == nil || !now.Before(e.until) {
		return nil
	}
	return e
}

// StartStep implements [idem.Journal.StartStep].
func (s *Store) StartStep(ctx context.Context, key, token, name string, retain time.Duration) (idem.StepEntry, error) {
	if err := ctx.Err(); err != nil {
		return idem.StepEntry{}, err
	}
	if retain <= 0 {
		return idem.StepEntry{}, idem.ErrInvalidDuration
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.leased(key, token, s.now())
	if e == nil {
		return idem.StepEntry{}, idem.ErrNotOwner
	}
	for _, st := range e.steps {
		if st.Name == name {
			st.Result = slices.Clone(st.Result)
			return st, nil
		}
	}
	if len(e.steps) >= idem.MaxSteps {
		return idem.StepEntry{}, idem.ErrTooManySteps
	}
	st := idem.StepEntry{Name: name, Token: token}
	e.steps = append(slices.Clip(e.steps), st) // a new array: copies handed out stay as they were
	e.retain = max(e.retain, retain)
	e.expires = e.until.Add(e.lapse())
	return st, nil
}

// FinishStep implements [idem.Journal.FinishStep].
func (s *Store) FinishStep(ctx context.Context, key, token, name string, result []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(result) > idem.MaxStepBytes {
		return idem.ErrTooLarge
	}
	stored := append([]byte{}, result...) // a copy, never nil
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.leased(key, token, s.now())
	if e == nil {
		return idem.ErrNotOwner
	}
	for i, st := range e.steps {
		if st.Name == name {
			if !st.Done {
				steps := slices.Clone(e.steps)
				steps[i].Done, steps[i].Result = true, stored
				e.steps = steps
			}
			return nil
		}
	}
	return idem.ErrNotOwner
}

// Suspend implements [idem.Journal.Suspend].
func (s *Store) Suspend(ctx context.Context, key, token string, keep time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if keep <= 0 {
		return idem.ErrInvalidDuration
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e := sh.leased(key, token, now)
	if e == nil {
		return idem.ErrNotOwner
	}
	e.until, e.keep.Uncertain = now, keep
	e.expires = now.Add(keep)
	return nil
}

// Steps implements [idem.Journal.Steps].
func (s *Store) Steps(ctx context.Context, key string) ([]idem.StepEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	now := s.now()
	e := sh.live(key, now)
	if e == nil || e.stateAt(now) == idem.StateExpired || len(e.steps) == 0 {
		sh.mu.Unlock()
		return nil, nil
	}
	steps := slices.Clone(e.steps)
	sh.mu.Unlock()
	for i := range steps {
		steps[i].Result = slices.Clone(steps[i].Result)
	}
	return steps, nil
}
