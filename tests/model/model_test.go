package model_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/memstore"
)

// The model-based test drives a store with random sequences of Acquire,
// Complete, Release, Extend, Get, clock advances and concurrent duplicate
// acquires over a few keys and tokens, and checks every answer against a
// reference model of one record per key:
//
//	absent → in-progress (token, fingerprint, lease) → completed (response, retention) → expired (= absent)
//
// plus Release (in-progress → absent) and Extend (new lease).
//
// # Time
//
// memstore runs on a fake clock (memstore.WithClock) that only the "advance"
// action moves, so every expiry is exact: margin 0, no ambiguity.
//
// Redis and MongoDB decide expiry on their own clock, so the model keeps, for
// each record, the window [start+d, end+d] in which it expires (start and end
// of the call that set it, d the lease or retention) and each action is
// timed the same way. An action that starts more than `margin` after the
// window is checked against "expired", one that ends more than `margin`
// before it against "live"; one that overlaps the window ± margin is near an
// expiry boundary and accepts either answer. The answer then says which
// branch the store took (acquired or not, ErrNotOwner or not, found or not)
// and the model follows that branch; when both branches give the same answer
// the model keeps the window and the next action decides again. After every
// action the Check step reads every key with Get and compares it the same
// way, which resyncs the model from the store's Get: a record seen expired
// is absent from then on. Time-dependent actions stay few and short: leases
// and retentions of 60 or 120 ms (else 1 h) and sleeps of 10–60 ms.

// tokens and fingerprints are drawn from these small sets, so that
// collisions (same token, other fingerprint) are frequent.
var (
	tokens       = []string{"tok-a", "tok-b", "tok-c"}
	fingerprints = []string{
		"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752",
	}
	// responses are opaque bytes to a store: an engine's encoding, every
	// byte value, a lone NUL, a short text.
	responses = [][]byte{
		[]byte("\x01\xc9\x01\x01\x0cContent-Type\x01\x10application/json" + `{"id":"pay_1"}`),
		binaryBody(),
		{0},
		[]byte("a response"),
	}
)

func binaryBody() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// clock is the time the model and (for memstore) the store agree on.
type clock interface {
	Now() time.Time
	Advance(d time.Duration)
}

type realClock struct{}

func (realClock) Now() time.Time          { return time.Now() }
func (realClock) Advance(d time.Duration) { time.Sleep(d) }

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// target is one store under test with its timing parameters.
type target struct {
	store  idem.Store
	clk    clock
	margin time.Duration // tolerance around expiry boundaries

	leases, retentions, advances []time.Duration

	// sameTokenReacquire: Acquire by the token that holds the live lease,
	// with the record's fingerprint, counts as acquired and leaves the
	// record as it is (redisstore: its SET NX GET sent again by the client
	// after a lost reply finds its own value). Other stores, and another
	// fingerprint, answer it like any other duplicate: not acquired,
	// record unchanged.
	sameTokenReacquire bool
	mem                *memstore.Store // memstore only: Len and Cleanup are checked too
	maxRecords         int             // memstore only: WithMaxRecords, 0 = default
}

// rec is the model of one key.
type rec struct {
	state  idem.State // 0: absent
	token  string
	fp     string
	resp   []byte
	lo, hi time.Time // expiry window of the in-progress or completed record
	// present: a record (live or expired) physically exists in the store;
	// false when the key was never acquired or was released (or, for
	// memstore, deleted by Cleanup). Redis deletes expired keys itself, so
	// it is only exact for memstore.
	present bool
}

type liveness int

const (
	free liveness = iota // absent or definitely expired
	live                 // definitely live
	near                 // near the expiry boundary: either
)

func (l liveness) String() string { return [...]string{"free", "live", "near"}[l] }

type machine struct {
	tg    *target
	keys  []string
	m     []rec
	ctx   context.Context
	stats map[string]int // outcome counts, logged at the end of run
}

func (mc *machine) status(i int, start, end time.Time) liveness {
	r := &mc.m[i]
	if r.state == 0 {
		return free
	}
	switch {
	case end.Add(mc.tg.margin).Before(r.lo):
		return live
	case !start.Add(-mc.tg.margin).Before(r.hi):
		return free
	}
	return near
}

// expire records that the store saw key i expired.
func (mc *machine) expire(i int) {
	mc.m[i].state, mc.m[i].token, mc.m[i].fp, mc.m[i].resp = 0, "", "", nil
}

func (mc *machine) present() int {
	n := 0
	for i := range mc.m {
		if mc.m[i].present {
			n++
		}
	}
	return n
}

// matches reports why got differs from the model record of key i, or "".
func (mc *machine) matches(i int, got idem.Record) string {
	r := &mc.m[i]
	if got.State != r.state || got.Fingerprint != r.fp {
		return fmt.Sprintf("record {%v fp %.8s} want {%v fp %.8s}", got.State, got.Fingerprint, r.state, r.fp)
	}
	switch r.state {
	case idem.StateInProgress:
		if got.Token != r.token || got.Response != nil {
			return fmt.Sprintf("in-progress record token %q response %q, want token %q and no response", got.Token, got.Response, r.token)
		}
	case idem.StateCompleted:
		// Stores may drop the token on completion (idem.Record.Token).
		if got.Token != "" && got.Token != r.token {
			return fmt.Sprintf("completed record token %q, want %q or empty", got.Token, r.token)
		}
		if !bytes.Equal(got.Response, r.resp) {
			return fmt.Sprintf("response %q, want %q", got.Response, r.resp)
		}
	}
	return ""
}

// note counts one outcome: operation, model liveness, ok (acquired, nil
// error, found), error kind.
func (mc *machine) note(op string, st liveness, ok bool, err error) {
	e := ""
	switch {
	case errors.Is(err, idem.ErrNotOwner):
		e = " ErrNotOwner"
	case errors.Is(err, memstore.ErrFull):
		e = " ErrFull"
	}
	mc.stats[fmt.Sprintf("%s %v ok=%v%s", op, st, ok, e)]++
}

func (mc *machine) ownedBy(i int, token string) bool {
	return mc.m[i].state == idem.StateInProgress && mc.m[i].token == token
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func drawDur(t *rapid.T, ds []time.Duration, label string) time.Duration {
	return rapid.SampledFrom(ds).Draw(t, label)
}

func (mc *machine) Acquire(t *rapid.T) {
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	tok := rapid.SampledFrom(tokens).Draw(t, "token")
	fp := rapid.SampledFrom(fingerprints).Draw(t, "fp")
	lease := drawDur(t, mc.tg.leases, "lease")

	start := mc.tg.clk.Now()
	got, acquired, err := mc.tg.store.Acquire(mc.ctx, mc.keys[i], tok, fp, lease)
	end := mc.tg.clk.Now()
	st := mc.status(i, start, end)
	t.Logf("Acquire(k%d, %s, %.4s, %v) = %v, %v, %v [model %v %v]", i, tok, fp, lease, got.State, acquired, err, mc.m[i].state, st)
	mc.note("Acquire", st, acquired, err)

	if mc.tg.maxRecords > 0 && !mc.m[i].present && mc.present() >= mc.tg.maxRecords {
		if !errors.Is(err, memstore.ErrFull) {
			t.Fatalf("Acquire of a new key with %d records held (max %d) = %v, %v; want ErrFull", mc.present(), mc.tg.maxRecords, acquired, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	take := func() {
		mc.m[i] = rec{state: idem.StateInProgress, token: tok, fp: fp, lo: start.Add(lease), hi: end.Add(lease), present: true}
	}
	reacquire := mc.tg.sameTokenReacquire && mc.ownedBy(i, tok) && mc.m[i].fp == fp
	switch {
	case st == free:
		if !acquired {
			t.Fatalf("Acquire on a free key not acquired; got %+v", got)
		}
		take()
	case reacquire:
		if !acquired {
			t.Fatalf("Acquire of its own lease (sameTokenReacquire) not acquired; got %+v", got)
		}
		if st != live { // near expiry: its own record, or a new one if that expired
			mc.m[i].lo = minTime(mc.m[i].lo, start.Add(lease))
			mc.m[i].hi = maxTime(mc.m[i].hi, end.Add(lease))
		}
	case st == live:
		if acquired {
			t.Fatalf("Acquire on a live %v record acquired it", mc.m[i].state)
		}
		if d := mc.matches(i, got); d != "" {
			t.Fatalf("Acquire returned %s", d)
		}
	default: // near expiry: either
		if acquired {
			take()
		} else if d := mc.matches(i, got); d != "" {
			t.Fatalf("Acquire near expiry, not acquired, returned %s", d)
		}
	}
}

func (mc *machine) Complete(t *rapid.T) {
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	tok := rapid.SampledFrom(tokens).Draw(t, "token")
	ri := rapid.IntRange(0, len(responses)-1).Draw(t, "response")
	ret := drawDur(t, mc.tg.retentions, "retention")

	start := mc.tg.clk.Now()
	err := mc.tg.store.Complete(mc.ctx, mc.keys[i], tok, responses[ri], ret)
	end := mc.tg.clk.Now()
	st := mc.status(i, start, end)
	t.Logf("Complete(k%d, %s, r%d, %v) = %v [model %v %s %v]", i, tok, ri, ret, err, mc.m[i].state, mc.m[i].token, st)
	mc.note("Complete", st, err == nil, err)
	if err != nil && !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete: %v", err)
	}
	owner := mc.ownedBy(i, tok)
	done := func() {
		r := &mc.m[i]
		r.state, r.resp, r.lo, r.hi = idem.StateCompleted, slices.Clone(responses[ri]), start.Add(ret), end.Add(ret)
	}
	switch {
	case owner && st == live:
		if err != nil {
			t.Fatalf("Complete by the owner of a live lease: %v", err)
		}
		done()
	case owner && st == near:
		if err == nil {
			done()
		} else {
			mc.expire(i)
		}
	default:
		if err == nil {
			t.Fatalf("Complete by a non-owner (model %v, owner %q) succeeded", mc.m[i].state, mc.m[i].token)
		}
	}
}

func (mc *machine) Release(t *rapid.T) {
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	tok := rapid.SampledFrom(tokens).Draw(t, "token")

	start := mc.tg.clk.Now()
	err := mc.tg.store.Release(mc.ctx, mc.keys[i], tok)
	end := mc.tg.clk.Now()
	st := mc.status(i, start, end)
	t.Logf("Release(k%d, %s) = %v [model %v %s %v]", i, tok, err, mc.m[i].state, mc.m[i].token, st)
	mc.note("Release", st, err == nil, err)
	if err != nil && !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Release: %v", err)
	}
	owner := mc.ownedBy(i, tok)
	switch {
	case owner && st == live:
		if err != nil {
			t.Fatalf("Release by the owner of a live lease: %v", err)
		}
		mc.m[i] = rec{}
	case owner && st == near:
		if err == nil {
			mc.m[i] = rec{}
		} else {
			mc.expire(i)
		}
	default:
		if err == nil {
			t.Fatalf("Release by a non-owner (model %v, owner %q) succeeded", mc.m[i].state, mc.m[i].token)
		}
	}
}

func (mc *machine) Extend(t *rapid.T) {
	ext, ok := mc.tg.store.(idem.Extender)
	if !ok {
		t.Skip("store has no Extend")
	}
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	tok := rapid.SampledFrom(tokens).Draw(t, "token")
	lease := drawDur(t, mc.tg.leases, "lease")

	start := mc.tg.clk.Now()
	err := ext.Extend(mc.ctx, mc.keys[i], tok, lease)
	end := mc.tg.clk.Now()
	st := mc.status(i, start, end)
	t.Logf("Extend(k%d, %s, %v) = %v [model %v %s %v]", i, tok, lease, err, mc.m[i].state, mc.m[i].token, st)
	mc.note("Extend", st, err == nil, err)
	if err != nil && !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Extend: %v", err)
	}
	owner := mc.ownedBy(i, tok)
	switch {
	case owner && st == live:
		if err != nil {
			t.Fatalf("Extend by the owner of a live lease: %v", err)
		}
		mc.m[i].lo, mc.m[i].hi = start.Add(lease), end.Add(lease)
	case owner && st == near:
		if err == nil {
			mc.m[i].lo, mc.m[i].hi = start.Add(lease), end.Add(lease)
		} else {
			mc.expire(i)
		}
	default:
		if err == nil {
			t.Fatalf("Extend by a non-owner (model %v, owner %q) succeeded", mc.m[i].state, mc.m[i].token)
		}
	}
}

func (mc *machine) Get(t *rapid.T) {
	mc.get(t, rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key"))
}

// get compares the store's Get of key i with the model and resyncs the
// model when the key is near an expiry boundary.
func (mc *machine) get(t *rapid.T, i int) {
	start := mc.tg.clk.Now()
	got, found, err := mc.tg.store.Get(mc.ctx, mc.keys[i])
	end := mc.tg.clk.Now()
	if err != nil {
		t.Fatalf("Get(k%d): %v", i, err)
	}
	st := mc.status(i, start, end)
	mc.note("Get", st, found, nil)
	switch {
	case st == free:
		if found {
			t.Fatalf("Get(k%d) found a %v record (fp %.8s, token %q), model has it absent or expired", i, got.State, got.Fingerprint, got.Token)
		}
	case st == live || found:
		if !found {
			t.Fatalf("Get(k%d) found nothing, model has a live %v record", i, mc.m[i].state)
		}
		if d := mc.matches(i, got); d != "" {
			t.Fatalf("Get(k%d) returned %s", i, d)
		}
	default: // near expiry, not found: the store saw it expire
		mc.expire(i)
	}
}

func (mc *machine) Advance(t *rapid.T) {
	d := drawDur(t, mc.tg.advances, "advance")
	t.Logf("Advance(%v)", d)
	mc.stats["Advance"]++
	mc.tg.clk.Advance(d)
}

// ConcurrentAcquire runs 2–3 acquires of one key at once under distinct
// tokens and fingerprints: at most one may acquire; every other one sees the
// live record (the previous one, or the winner's).
func (mc *machine) ConcurrentAcquire(t *rapid.T) {
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	if mc.tg.maxRecords > 0 && !mc.m[i].present && mc.present() >= mc.tg.maxRecords {
		t.Skip("memstore full")
	}
	toks := rapid.Permutation(tokens).Draw(t, "tokens")[:rapid.IntRange(2, len(tokens)).Draw(t, "n")]
	lease := drawDur(t, mc.tg.leases, "lease")
	type result struct {
		rec      idem.Record
		acquired bool
		err      error
	}
	res := make([]result, len(toks))
	fps := make([]string, len(toks))
	for j := range toks {
		fps[j] = fingerprints[j%len(fingerprints)]
	}
	var wg sync.WaitGroup
	start := mc.tg.clk.Now()
	for j := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &res[j]
			r.rec, r.acquired, r.err = mc.tg.store.Acquire(mc.ctx, mc.keys[i], toks[j], fps[j], lease)
		}()
	}
	wg.Wait()
	end := mc.tg.clk.Now()
	st := mc.status(i, start, end)
	winner := -1
	for j, r := range res {
		t.Logf("  concurrent Acquire(k%d, %s, %.4s, %v) = %v, %v, %v", i, toks[j], fps[j], lease, r.rec.State, r.acquired, r.err)
		if r.err != nil {
			t.Fatalf("concurrent Acquire: %v", r.err)
		}
		if r.acquired {
			if winner >= 0 && !(mc.tg.sameTokenReacquire && toks[j] == toks[winner]) {
				t.Fatalf("concurrent Acquire: both %s and %s acquired k%d", toks[winner], toks[j], i)
			}
			winner = j
		}
	}
	t.Logf("ConcurrentAcquire(k%d, %v) winner %d [model %v %s %v]", i, toks, winner, mc.m[i].state, mc.m[i].token, st)
	mc.note("ConcurrentAcquire", st, winner >= 0, nil)
	prev := mc.m[i]
	reacquire := winner >= 0 && mc.tg.sameTokenReacquire && prev.state == idem.StateInProgress && prev.token == toks[winner] && prev.fp == fps[winner]
	switch {
	case reacquire && st == live: // its own record, as it was
	case reacquire && st != free: // near expiry: its own record, or a new one
		mc.m[i].lo = minTime(prev.lo, start.Add(lease))
		mc.m[i].hi = maxTime(prev.hi, end.Add(lease))
	case winner >= 0:
		if st == live {
			t.Fatalf("concurrent Acquire acquired a live %v record", prev.state)
		}
		mc.m[i] = rec{state: idem.StateInProgress, token: toks[winner], fp: fps[winner], lo: start.Add(lease), hi: end.Add(lease), present: true}
	case st == free:
		t.Fatalf("concurrent Acquire on a free key: nobody acquired")
	}
	// Losers see either the winner's record or (no winner, or before it
	// took over an expiring one) the previous record.
	for j, r := range res {
		if j == winner || (winner >= 0 && r.acquired) {
			continue
		}
		d := mc.matches(i, r.rec)
		if d != "" && winner >= 0 && st != free && prev.state != 0 {
			saved := mc.m[i]
			mc.m[i] = prev
			d = mc.matches(i, r.rec)
			mc.m[i] = saved
		}
		if d != "" {
			t.Fatalf("concurrent Acquire loser %s returned %s", toks[j], d)
		}
	}
}

// Cleanup (memstore only) deletes the expired records: exactly those the
// model holds present and expired.
func (mc *machine) Cleanup(t *rapid.T) {
	if mc.tg.mem == nil {
		t.Skip("memstore only")
	}
	now := mc.tg.clk.Now()
	want := 0
	for i := range mc.m {
		if mc.m[i].present && mc.status(i, now, now) == free {
			want++
			mc.m[i] = rec{}
		}
	}
	got := mc.tg.mem.Cleanup()
	t.Logf("Cleanup() = %d [model %d]", got, want)
	mc.stats[fmt.Sprintf("Cleanup deleted>0=%v", got > 0)]++
	if got != want {
		t.Fatalf("Cleanup deleted %d records, model has %d expired", got, want)
	}
}

// Check runs after every action: every key's Get matches the model, and
// memstore's Len counts exactly the records present.
func (mc *machine) Check(t *rapid.T) {
	for i := range mc.keys {
		mc.get(t, i)
	}
	if mc.tg.mem != nil {
		if got, want := mc.tg.mem.Len(), mc.present(); got != want {
			t.Fatalf("memstore Len() = %d, model holds %d records", got, want)
		}
	}
}

// run checks newTarget's stores against the model with checks random
// sequences (unless -rapid.checks or RAPID_CHECKS says otherwise).
func run(t *testing.T, checks int, newTarget func(t *rapid.T) *target) {
	setChecks(checks)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	n := 0
	stats := map[string]int{}
	rapid.Check(t, func(rt *rapid.T) {
		n++
		tg := newTarget(rt)
		mc := &machine{tg: tg, ctx: ctx, m: make([]rec, 3), stats: stats}
		for range mc.m {
			mc.keys = append(mc.keys, storetest.Key())
		}
		rt.Repeat(rapid.StateMachineActions(mc))
	})
	t.Logf("%d sequences (shrinking included) in %v; outcomes [op, model liveness, ok, error]:", n, time.Since(start).Round(time.Millisecond))
	for _, k := range slices.Sorted(maps.Keys(stats)) {
		t.Logf("  %-45s %6d", k, stats[k])
	}
}

func TestModelMemstore(t *testing.T) {
	run(t, 1000, func(rt *rapid.T) *target {
		clk := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
		max := rapid.SampledFrom([]int{0, 2}).Draw(rt, "maxRecords")
		opts := []memstore.Option{memstore.WithClock(clk.Now), memstore.WithCleanupInterval(0)}
		if max > 0 {
			opts = append(opts, memstore.WithMaxRecords(max))
		}
		s := memstore.New(opts...)
		return &target{
			store: s, mem: s, maxRecords: max, clk: clk,
			leases:     []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, time.Hour},
			retentions: []time.Duration{time.Second, 3 * time.Second, 24 * time.Hour},
			advances:   []time.Duration{time.Millisecond, 500 * time.Millisecond, time.Second, 2*time.Second - time.Nanosecond, 3 * time.Second},
		}
	})
}

// Real-clock stores: short leases and sleeps, a margin for scheduling jitter
// and (MongoDB) millisecond dates and the server clock offset.
var (
	realLeases     = []time.Duration{60 * time.Millisecond, 120 * time.Millisecond, time.Hour, time.Hour}
	realRetentions = []time.Duration{80 * time.Millisecond, time.Hour}
	realAdvances   = []time.Duration{10 * time.Millisecond, 30 * time.Millisecond, 60 * time.Millisecond}
)

const realMargin = 25 * time.Millisecond
