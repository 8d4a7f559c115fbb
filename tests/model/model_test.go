package model_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/memstore"
)

// The model-based test drives a store with random sequences of every
// operation of the store contract (Acquire, AcquireKeep, Complete,
// Release, Extend, Resolve, Get, Inspect, Evict, List, Purge or memstore's
// Cleanup), clock advances and concurrent duplicate acquires over a few
// keys and tokens, and checks every answer against a reference model of
// one record per key. A record goes through phases:
//
//	absent → in-progress (token, fingerprint, lease, keep) → completed (response, retention)
//	in-progress --lease lapses--> uncertain (Keep.Uncertain > 0) --keep ends--> expired (= absent)
//	completed --retention ends--> tombstone, StateExpired (Keep.Tombstone > 0) --keep ends--> absent
//
// plus Release and Resolve(nil) (→ absent), Resolve(response) (uncertain →
// completed), Extend (new lease; an uncertain record's owner renews it back
// to in-progress) and Evict (the inspected record → absent).
//
// # Time
//
// memstore runs on a fake clock (memstore.WithClock) that only the "advance"
// action moves, so every phase end is exact: margin 0, no ambiguity.
//
// The other stores decide expiry on their own clock, so the model keeps, for
// each record, the window [lo, hi] = [start+d, end+d] in which its current
// phase ends (start and end of the call that set it, d the lease,
// retention or keep) and each action is timed the same way. For an action
// over [start, end] the model lists the candidate records the store may
// hold: the current phase unless it ended more than `margin` before start,
// then, unless it ends more than `margin` after end, the next phase (with
// window [lo+keep, hi+keep]) and so on down to absent. Each candidate gives
// the answer it implies and the record after the action; the store's answer
// must be one of them, and the model follows the candidates that gave it:
// one, or several whose result is the same record (their windows merged),
// or several the action leaves unchanged (the model stays as it was, and a
// later action decides). After every action Check reads every key with Get,
// which resyncs the model. Time-dependent actions stay few and short:
// leases, retentions and keeps of 60 to 120 ms (else 1 h) and sleeps of
// 10–60 ms.

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

// purger is the Purge of the SQL stores and mongostore.
type purger interface {
	Purge(ctx context.Context) (int64, error)
}

// target is one store under test with its timing parameters.
type target struct {
	store  idem.Store
	clk    clock
	margin time.Duration // tolerance around phase ends

	leases, retentions, advances, keeps []time.Duration

	// reacquire is how Acquire by the token that holds the record's lease
	// (an engine's acquire sent again after its reply was lost) answers.
	reacquire  reacquireMode
	mem        *memstore.Store // memstore only: Len and Cleanup are checked too
	maxRecords int             // memstore only: WithMaxRecords, 0 = default

	// purge is the store's Purge (nil: none); purgeCounted: its count is
	// checked against the rows the model knows expired (SQL stores, whose
	// rows stay until purged or taken over).
	purge        purger
	purgeCounted bool
	// lapsedListed: List shows an in-progress row whose lease (and keep)
	// ended as in-progress with TTL <= 0 until it is purged or taken over
	// (SQL stores, mongostore); Redis deletes it.
	lapsedListed bool
	// reset empties the store between sequences (Purge counts every row).
	reset func()
}

// reacquireMode is how a store answers Acquire by the token of its
// in-progress (or uncertain) record.
type reacquireMode uint8

const (
	// reacquireNone: like any duplicate, not acquired (memstore,
	// mongostore).
	reacquireNone reacquireMode = iota
	// reacquireSame: with the record's fingerprint and keep, in progress
	// or uncertain, acquired, record unchanged (redisstore: its SET NX GET
	// sent again finds its own value: token, fingerprint and keep).
	reacquireSame
	// reacquireReplace: in progress or uncertain, acquired, the record
	// written again with the call's fingerprint, lease and keep (pgstore,
	// mysqlstore: the acquire statement treats the token's own row as
	// free).
	reacquireReplace
)

// presence says whether a row of the key physically exists (live or
// expired, not yet purged): exact for memstore; for real-clock stores a
// row near its end may or may not have been purged.
type presence uint8

const (
	presNo presence = iota
	presYes
	presMaybe
)

// rec is the model of one key in one phase.
type rec struct {
	state  idem.State // 0: absent
	token  string
	fp     string
	resp   []byte
	keep   idem.Keep
	lo, hi time.Time // window in which this phase ends
}

// next is the phase after r ends: uncertain, tombstone, or absent.
func (r rec) next() rec {
	switch {
	case r.state == idem.StateInProgress && r.keep.Uncertain > 0:
		return rec{state: idem.StateUncertain, token: r.token, fp: r.fp, keep: r.keep, lo: r.lo.Add(r.keep.Uncertain), hi: r.hi.Add(r.keep.Uncertain)}
	case r.state == idem.StateCompleted && r.keep.Tombstone > 0:
		return rec{state: idem.StateExpired, fp: r.fp, keep: r.keep, lo: r.lo.Add(r.keep.Tombstone), hi: r.hi.Add(r.keep.Tombstone)}
	}
	return rec{}
}

// same reports whether a and b are the same record, windows aside.
func same(a, b rec) bool {
	return a.state == b.state && a.token == b.token && a.fp == b.fp && bytes.Equal(a.resp, b.resp) && a.keep == b.keep
}

// view is what a store answers about a record: the fields a caller may
// rely on in its state (a completed or expired record's token may be
// dropped, idem.Record.Token).
func (r rec) view() string {
	switch r.state {
	case 0:
		return "absent"
	case idem.StateInProgress, idem.StateUncertain:
		return fmt.Sprintf("%v fp=%.8s token=%s", r.state, r.fp, r.token)
	case idem.StateCompleted:
		return fmt.Sprintf("%v fp=%.8s resp=%.16q(%d)", r.state, r.fp, r.resp, len(r.resp))
	}
	return fmt.Sprintf("%v fp=%.8s", r.state, r.fp)
}

// viewOf is view for a record a store returned.
func viewOf(got idem.Record) string {
	r := rec{state: got.State, token: got.Token, fp: got.Fingerprint, resp: got.Response}
	if got.State == idem.StateExpired && got.Response != nil {
		return r.view() + " with a response"
	}
	if got.State != idem.StateCompleted && got.Response != nil {
		return r.view() + fmt.Sprintf(" resp=%.16q", got.Response)
	}
	return r.view()
}

// effect is what an action does to a candidate record.
type effect struct {
	answer string
	next   rec
	pres   presence // presNo: delete the row, presYes: write one, presMaybe: leave it
}

func keepAs(r rec) effect { return effect{answer: "", next: r, pres: presMaybe} }

type machine struct {
	tg    *target
	keys  []string
	m     []rec
	pres  []presence
	ctx   context.Context
	stats map[string]int // outcome counts, logged at the end of run
	log   []string       // the actions so far, for failure messages
}

// logf logs an action and keeps it for a failure message (rapid prints
// only the log of its last, shrunk, run; with a real clock that run may
// pass).
func (mc *machine) logf(t *rapid.T, format string, args ...any) {
	t.Helper()
	t.Logf(format, args...)
	mc.log = append(mc.log, fmt.Sprintf(format, args...))
}

// fatalf fails with the actions that led there.
func (mc *machine) fatalf(t *rapid.T, format string, args ...any) {
	t.Helper()
	t.Fatalf(format+"\nafter:\n  %s", append(args, strings.Join(mc.log[max(0, len(mc.log)-40):], "\n  "))...)
}

// cands lists the records key i may hold during [start, end], current
// phase first, absent last.
func (mc *machine) cands(i int, start, end time.Time) []rec {
	var out []rec
	for r := mc.m[i]; r.state != 0; r = r.next() {
		if start.Add(-mc.tg.margin).Before(r.hi) {
			out = append(out, r)
		}
		if end.Add(mc.tg.margin).Before(r.lo) {
			return out
		}
	}
	return append(out, rec{})
}

// decide checks the store's answer got to an action on key i over
// [start, end] against every candidate's effect f and moves the model.
func (mc *machine) decide(t *rapid.T, op string, i int, start, end time.Time, got string, f func(c rec) effect) {
	cs := mc.cands(i, start, end)
	var match []rec
	var effs []effect
	var wants []string
	for _, c := range cs {
		e := f(c)
		wants = append(wants, fmt.Sprintf("[%s: %s]", c.view(), e.answer))
		if e.answer == got {
			match, effs = append(match, c), append(effs, e)
		}
	}
	kind := "exact"
	if len(cs) > 1 {
		kind = "near"
	}
	mc.stats[fmt.Sprintf("%s %s → %s", op, kind, short(got))]++
	if len(match) == 0 {
		mc.fatalf(t, "%s(k%d) = %s; the model allows %s", op, i, got, strings.Join(wants, " or "))
	}
	noop := true
	for j := range match {
		if !same(match[j], effs[j].next) || match[j].lo != effs[j].next.lo || effs[j].pres == presNo || effs[j].pres == presYes && mc.pres[i] != presYes {
			noop = false
		}
	}
	if noop {
		return // the model's phases still cover every candidate
	}
	effs = mc.disambiguate(t, op, i, got, effs)
	n := effs[0].next
	p := effs[0].pres
	for _, e := range effs[1:] {
		if !same(e.next, n) {
			mc.fatalf(t, "%s(k%d) = %s: ambiguous, candidates lead to %s and %s", op, i, got, n.view(), e.next.view())
		}
		if n.state != 0 {
			n.lo, n.hi = minTime(n.lo, e.next.lo), maxTime(n.hi, e.next.hi)
		}
		if e.pres != p {
			p = presMaybe
			mc.pres[i] = presMaybe // written by one candidate, left or deleted by another
		}
	}
	mc.m[i] = n
	if p != presMaybe {
		mc.pres[i] = p
	}
}

// disambiguate keeps, when an answer near a phase's end matched candidates
// that lead to different records (on a loaded machine an action's
// [start, end] can straddle a lease's end), those whose next record, or
// a later phase of it, is what the store holds now (one Get: an
// observation, not a guess). It returns effs unchanged when they agree, or
// when the observation cannot tell them apart.
func (mc *machine) disambiguate(t *rapid.T, op string, i int, got string, effs []effect) []effect {
	agree := true
	for _, e := range effs[1:] {
		agree = agree && same(e.next, effs[0].next)
	}
	if agree {
		return effs
	}
	now, found, err := mc.tg.store.Get(mc.ctx, mc.keys[i])
	if err != nil {
		mc.fatalf(t, "%s(k%d) = %s: Get to tell the candidates apart: %v", op, i, got, err)
	}
	seen := "absent"
	if found {
		seen = viewOf(now)
	}
	mc.logf(t, "Get(k%d) = %s [to tell %d candidates apart]", i, seen, len(effs))
	at := mc.tg.clk.Now()
	var exact, later []effect
	for _, e := range effs {
		if e.next.view() == seen {
			exact = append(exact, e)
			continue
		}
		// a later phase, only once the phase before it can have ended
		for prev, r := e.next, e.next.next(); prev.state != 0 && !at.Add(mc.tg.margin).Before(prev.lo); prev, r = r, r.next() {
			if r.view() == seen {
				later = append(later, e)
				break
			}
		}
	}
	switch {
	case len(exact) > 0:
		return exact
	case len(later) > 0:
		return later
	}
	mc.fatalf(t, "%s(k%d) = %s, then Get = %s: no candidate leads there", op, i, got, seen)
	return nil
}

// short is an answer without its fields: "held: uncertain", "ok".
func short(answer string) string {
	f := strings.Fields(answer)
	if len(f) > 1 && strings.HasSuffix(f[0], ":") || len(f) > 1 && f[0] == "not" {
		return f[0] + " " + f[1]
	}
	return f[0]
}

func (mc *machine) present() int {
	n := 0
	for _, p := range mc.pres {
		if p == presYes {
			n++
		}
	}
	return n
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

func errAnswer(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, idem.ErrNotOwner):
		return "ErrNotOwner"
	case errors.Is(err, idem.ErrRecordChanged):
		return "ErrRecordChanged"
	}
	return "error: " + err.Error()
}

// owns reports whether token may Complete, Release or Extend c: it holds
// its live lease, or the record is uncertain and was its (Keep.Uncertain).
func owns(c rec, token string) bool {
	return (c.state == idem.StateInProgress || c.state == idem.StateUncertain) && c.token == token
}

// acquireEffect is what Acquire(token, fp, lease, keep) over [start, end]
// does to candidate c.
func (mc *machine) acquireEffect(c rec, tok, fp string, lease time.Duration, keep idem.Keep, start, end time.Time) effect {
	switch {
	case c.state == 0:
		return effect{answer: "acquired", next: rec{state: idem.StateInProgress, token: tok, fp: fp, keep: keep, lo: start.Add(lease), hi: end.Add(lease)}, pres: presYes}
	case (c.state == idem.StateInProgress || c.state == idem.StateUncertain) && mc.tg.reacquire == reacquireSame &&
		c.token == tok && c.fp == fp && c.keep == keep:
		e := keepAs(c)
		e.answer = "acquired"
		return e
	case (c.state == idem.StateInProgress || c.state == idem.StateUncertain) && mc.tg.reacquire == reacquireReplace && c.token == tok:
		return mc.acquireEffect(rec{}, tok, fp, lease, keep, start, end)
	}
	e := keepAs(c)
	e.answer = "held: " + c.view()
	return e
}

func acquireAnswer(got idem.Record, acquired bool, err error) string {
	switch {
	case err != nil:
		return errAnswer(err)
	case acquired:
		return "acquired"
	}
	return "held: " + viewOf(got)
}

// reacquireKeep is the keep of an Acquire of key i: under
// reacquireSame, the in-progress record's own keep, so that its
// holder acquiring it again near its lease's end (its own record, or a new
// one) leaves one record the model can follow.
func (mc *machine) reacquireKeep(i int, keep idem.Keep) idem.Keep {
	if mc.tg.reacquire == reacquireSame && (mc.m[i].state == idem.StateInProgress || mc.m[i].state == idem.StateUncertain) {
		return mc.m[i].keep
	}
	return keep
}

func (mc *machine) drawKeep(t *rapid.T) idem.Keep {
	return idem.Keep{Uncertain: drawDur(t, mc.tg.keeps, "uncertain"), Tombstone: drawDur(t, mc.tg.keeps, "tombstone")}
}

func (mc *machine) Acquire(t *rapid.T) {
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	tok := rapid.SampledFrom(tokens).Draw(t, "token")
	fp := rapid.SampledFrom(fingerprints).Draw(t, "fp")
	lease := drawDur(t, mc.tg.leases, "lease")
	keep := idem.Keep{}
	plain := rapid.Bool().Draw(t, "plain")
	if !plain {
		keep = mc.drawKeep(t)
	}
	keep, plain = mc.reacquireKeep(i, keep), plain && mc.reacquireKeep(i, keep) == idem.Keep{}

	start := mc.tg.clk.Now()
	var got idem.Record
	var acquired bool
	var err error
	if plain {
		got, acquired, err = mc.tg.store.Acquire(mc.ctx, mc.keys[i], tok, fp, lease)
	} else {
		got, acquired, err = mc.tg.store.(idem.Keeper).AcquireKeep(mc.ctx, mc.keys[i], tok, fp, lease, keep)
	}
	end := mc.tg.clk.Now()
	mc.logf(t, "AcquireKeep(k%d, %s, %.4s, %v, %+v) = %s, %v, %v [model %s]", i, tok, fp, lease, keep, viewOf(got), acquired, err, mc.m[i].view())

	if mc.tg.maxRecords > 0 && mc.pres[i] != presYes && mc.present() >= mc.tg.maxRecords {
		if !errors.Is(err, memstore.ErrFull) {
			mc.fatalf(t, "Acquire of a new key with %d records held (max %d) = %v, %v; want ErrFull", mc.present(), mc.tg.maxRecords, acquired, err)
		}
		mc.stats["Acquire ErrFull"]++
		return
	}
	if got.State == idem.StateInProgress && !acquired && (got.LeaseLeft < 0 || got.LeaseLeft > lease && got.LeaseLeft > time.Hour) {
		mc.fatalf(t, "Acquire returned LeaseLeft %v", got.LeaseLeft)
	}
	mc.decide(t, "Acquire", i, start, end, acquireAnswer(got, acquired, err), func(c rec) effect {
		return mc.acquireEffect(c, tok, fp, lease, keep, start, end)
	})
}

func (mc *machine) Complete(t *rapid.T) {
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	tok := rapid.SampledFrom(tokens).Draw(t, "token")
	ri := rapid.IntRange(0, len(responses)-1).Draw(t, "response")
	ret := drawDur(t, mc.tg.retentions, "retention")

	start := mc.tg.clk.Now()
	err := mc.tg.store.Complete(mc.ctx, mc.keys[i], tok, responses[ri], ret)
	end := mc.tg.clk.Now()
	mc.logf(t, "Complete(k%d, %s, r%d, %v) = %v [model %s]", i, tok, ri, ret, err, mc.m[i].view())
	mc.decide(t, "Complete", i, start, end, errAnswer(err), func(c rec) effect {
		if !owns(c, tok) {
			e := keepAs(c)
			e.answer = "ErrNotOwner"
			return e
		}
		return effect{answer: "ok", pres: presYes, next: rec{state: idem.StateCompleted, token: tok, fp: c.fp, resp: slices.Clone(responses[ri]), keep: c.keep, lo: start.Add(ret), hi: end.Add(ret)}}
	})
}

func (mc *machine) Release(t *rapid.T) {
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	tok := rapid.SampledFrom(tokens).Draw(t, "token")

	start := mc.tg.clk.Now()
	err := mc.tg.store.Release(mc.ctx, mc.keys[i], tok)
	end := mc.tg.clk.Now()
	mc.logf(t, "Release(k%d, %s) = %v [model %s]", i, tok, err, mc.m[i].view())
	mc.decide(t, "Release", i, start, end, errAnswer(err), func(c rec) effect {
		if !owns(c, tok) {
			e := keepAs(c)
			e.answer = "ErrNotOwner"
			return e
		}
		return effect{answer: "ok", pres: presNo}
	})
}

func (mc *machine) Extend(t *rapid.T) {
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	tok := rapid.SampledFrom(tokens).Draw(t, "token")
	lease := drawDur(t, mc.tg.leases, "lease")

	start := mc.tg.clk.Now()
	err := mc.tg.store.(idem.Extender).Extend(mc.ctx, mc.keys[i], tok, lease)
	end := mc.tg.clk.Now()
	mc.logf(t, "Extend(k%d, %s, %v) = %v [model %s]", i, tok, lease, err, mc.m[i].view())
	mc.decide(t, "Extend", i, start, end, errAnswer(err), func(c rec) effect {
		if !owns(c, tok) {
			e := keepAs(c)
			e.answer = "ErrNotOwner"
			return e
		}
		return effect{answer: "ok", pres: presYes, next: rec{state: idem.StateInProgress, token: tok, fp: c.fp, keep: c.keep, lo: start.Add(lease), hi: end.Add(lease)}}
	})
}

// Resolve ends an uncertain record: nil response deletes it, else it
// completes with the response.
func (mc *machine) Resolve(t *rapid.T) {
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	ri := rapid.IntRange(-1, len(responses)-1).Draw(t, "response")
	ret := drawDur(t, mc.tg.retentions, "retention")
	var resp []byte
	if ri >= 0 {
		resp = responses[ri]
	}

	start := mc.tg.clk.Now()
	err := mc.tg.store.(idem.Keeper).Resolve(mc.ctx, mc.keys[i], resp, ret)
	end := mc.tg.clk.Now()
	mc.logf(t, "Resolve(k%d, r%d, %v) = %v [model %s]", i, ri, ret, err, mc.m[i].view())
	mc.decide(t, "Resolve", i, start, end, errAnswer(err), func(c rec) effect {
		switch {
		case c.state != idem.StateUncertain:
			e := keepAs(c)
			e.answer = "ErrRecordChanged"
			return e
		case resp == nil:
			return effect{answer: "ok", pres: presNo}
		}
		return effect{answer: "ok", pres: presYes, next: rec{state: idem.StateCompleted, token: c.token, fp: c.fp, resp: slices.Clone(resp), keep: c.keep, lo: start.Add(ret), hi: end.Add(ret)}}
	})
}

func (mc *machine) Get(t *rapid.T) {
	mc.get(t, rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key"))
}

// readEffect is a read's effect: found or not, the candidate unchanged.
func readEffect(c rec) effect {
	e := keepAs(c)
	e.answer = "found: " + c.view()
	if c.state == 0 {
		e.answer = "not found"
	}
	return e
}

func readAnswer(got idem.Record, found bool, err error) string {
	switch {
	case err != nil:
		return errAnswer(err)
	case !found:
		return "not found"
	}
	return "found: " + viewOf(got)
}

// get compares the store's Get of key i with the model and resyncs it.
func (mc *machine) get(t *rapid.T, i int) {
	start := mc.tg.clk.Now()
	got, found, err := mc.tg.store.Get(mc.ctx, mc.keys[i])
	end := mc.tg.clk.Now()
	mc.read(t, "Get", i, start, end, readAnswer(got, found, err))
}

// read moves the model to the candidate a read saw: reads leave records
// unchanged, but tell which phase the store is in.
func (mc *machine) read(t *rapid.T, op string, i int, start, end time.Time, got string) {
	cs := mc.cands(i, start, end)
	mc.decide(t, op, i, start, end, got, readEffect)
	for _, c := range cs {
		if readEffect(c).answer == got && got != readEffect(cs[0]).answer {
			// the phase changed: the store is at c (or a later candidate
			// with the same answer; none has one).
			mc.m[i] = c
			return
		}
	}
}

// Inspect is Get with the time to live, for stores that are an
// idem.Inspector; then, sometimes, Evict of what it saw (or of a record
// with another fingerprint, which must be refused).
func (mc *machine) Inspect(t *rapid.T) {
	ins, ok := mc.tg.store.(idem.Inspector)
	if !ok {
		t.Skip("not an Inspector")
	}
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	start := mc.tg.clk.Now()
	info, found, err := ins.Inspect(mc.ctx, mc.keys[i])
	end := mc.tg.clk.Now()
	mc.logf(t, "Inspect(k%d) = %s TTL %v, %v, %v [model %s]", i, viewOf(info.Record), info.TTL, found, err, mc.m[i].view())
	if found {
		// TTL: the time to the end of the phase, by the store's clock.
		var c rec
		for _, x := range mc.cands(i, start, end) {
			if x.view() == viewOf(info.Record) {
				c = x
				break
			}
		}
		if c.state != 0 && (info.TTL < -mc.tg.margin || info.TTL > c.hi.Sub(start)+mc.tg.margin+time.Millisecond) {
			mc.fatalf(t, "Inspect(k%d) TTL %v, the phase ends within %v", i, info.TTL, c.hi.Sub(start))
		}
	}
	mc.read(t, "Inspect", i, start, end, readAnswer(info.Record, found, err))
	if !found || !rapid.Bool().Draw(t, "evict") {
		return
	}
	seen := info.Record
	if rapid.Bool().Draw(t, "other fingerprint") {
		seen.Fingerprint = fingerprints[0]
		if info.Fingerprint == fingerprints[0] {
			seen.Fingerprint = fingerprints[1]
		}
	}
	start = mc.tg.clk.Now()
	err = ins.Evict(mc.ctx, mc.keys[i], seen)
	end = mc.tg.clk.Now()
	mc.logf(t, "Evict(k%d, %s) = %v [model %s]", i, viewOf(seen), err, mc.m[i].view())
	mc.decide(t, "Evict", i, start, end, errAnswer(err), func(c rec) effect {
		if c.state == 0 || viewOf(seen) != c.view() {
			e := keepAs(c)
			e.answer = "ErrRecordChanged"
			return e
		}
		return effect{answer: "ok", pres: presNo}
	})
}

// List, for stores that are an idem.Lister, lists every key by its full
// key as prefix: a live in-progress, completed or uncertain record is
// listed, a tombstone never, an absent key never unless its row is an
// in-progress one whose lease (and keep) ended, kept until purged
// (lapsedListed, TTL <= 0).
func (mc *machine) List(t *rapid.T) {
	ls, ok := mc.tg.store.(idem.Lister)
	if !ok {
		t.Skip("not a Lister")
	}
	state := rapid.SampledFrom([]idem.State{0, idem.StateInProgress, idem.StateCompleted, idem.StateUncertain}).Draw(t, "state")
	for i, key := range mc.keys {
		start := mc.tg.clk.Now()
		var listed []idem.ListedRecord
		q := idem.ListQuery{KeyPrefix: key, State: state, Limit: 5}
		for {
			page, err := ls.List(mc.ctx, q)
			if err != nil {
				mc.fatalf(t, "List(k%d): %v", i, err)
			}
			listed = append(listed, page.Records...)
			if page.Next == "" {
				break
			}
			q.Cursor = page.Next
		}
		end := mc.tg.clk.Now()
		if len(listed) > 1 {
			mc.fatalf(t, "List(k%d) listed %d records", i, len(listed))
		}
		ok := false
		var wants []string
		for _, c := range mc.cands(i, start, end) {
			var want string
			switch {
			case c.state == idem.StateExpired || c.state == 0 || state != 0 && c.state != state:
				want = "none"
			default:
				c.resp = nil // listed without it
				want = c.view()
			}
			wants = append(wants, want)
			switch {
			case len(listed) == 0 && want == "none":
				ok = true
			case len(listed) == 1 && listed[0].Key == key && listed[0].Response == nil && viewOf(listed[0].Record) == want && listed[0].TTL > -mc.tg.margin:
				ok = true
			case len(listed) == 1 && c.state == 0 && mc.tg.lapsedListed && mc.pres[i] != presNo &&
				listed[0].State == idem.StateInProgress && listed[0].TTL <= 0 && (state == 0 || state == idem.StateInProgress):
				ok = true
			}
		}
		got := "none"
		if len(listed) == 1 {
			got = fmt.Sprintf("%s TTL %v", viewOf(listed[0].Record), listed[0].TTL)
		}
		mc.logf(t, "List(k%d, state %v) = %s [model %s]", i, state, got, mc.m[i].view())
		mc.stats[fmt.Sprintf("List → %s", short(got))]++
		if !ok {
			mc.fatalf(t, "List(k%d, state %v) = %s; the model allows %v", i, state, got, wants)
		}
	}
}

// Purge deletes the expired rows: at least those the model knows expired
// and present, at most those that may have (purgeCounted); records that
// are not expired are left as they were (Check reads them after).
func (mc *machine) Purge(t *rapid.T) {
	if mc.tg.purge == nil {
		t.Skip("no Purge")
	}
	start := mc.tg.clk.Now()
	n, err := mc.tg.purge.Purge(mc.ctx)
	end := mc.tg.clk.Now()
	if err != nil {
		mc.fatalf(t, "Purge: %v", err)
	}
	lo, hi := 0, 0
	for i := range mc.keys {
		cs := mc.cands(i, start, end)
		gone := cs[len(cs)-1].state == 0
		switch {
		case gone && len(cs) == 1 && mc.pres[i] != presNo:
			if mc.pres[i] == presYes {
				lo++
			}
			hi++
			mc.pres[i] = presNo
		case gone && mc.pres[i] != presNo:
			hi++
			mc.pres[i] = presMaybe
		}
	}
	mc.logf(t, "Purge() = %d [model %d..%d]", n, lo, hi)
	mc.stats[fmt.Sprintf("Purge deleted>0=%v", n > 0)]++
	if mc.tg.purgeCounted && (n < int64(lo) || n > int64(hi)) {
		mc.fatalf(t, "Purge deleted %d rows, the model has %d to %d expired", n, lo, hi)
	}
}

func (mc *machine) Advance(t *rapid.T) {
	d := drawDur(t, mc.tg.advances, "advance")
	mc.logf(t, "Advance(%v)", d)
	mc.stats["Advance"]++
	mc.tg.clk.Advance(d)
}

// ConcurrentAcquire runs 2–3 acquires of one key at once under distinct
// tokens and fingerprints: at most one may acquire; every other one sees
// a record the key may have held before, or the winner's.
func (mc *machine) ConcurrentAcquire(t *rapid.T) {
	i := rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
	if mc.tg.maxRecords > 0 && mc.pres[i] != presYes && mc.present() >= mc.tg.maxRecords {
		t.Skip("memstore full")
	}
	toks := rapid.Permutation(tokens).Draw(t, "tokens")[:rapid.IntRange(2, len(tokens)).Draw(t, "n")]
	lease := drawDur(t, mc.tg.leases, "lease")
	keep := mc.reacquireKeep(i, mc.drawKeep(t))
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
		wg.Go(func() {
			r := &res[j]
			r.rec, r.acquired, r.err = mc.tg.store.(idem.Keeper).AcquireKeep(mc.ctx, mc.keys[i], toks[j], fps[j], lease, keep)
		})
	}
	wg.Wait()
	end := mc.tg.clk.Now()
	winner, winners := -1, 0
	for j, r := range res {
		mc.logf(t, "  concurrent AcquireKeep(k%d, %s, %.4s, %v, %+v) = %s, %v, %v", i, toks[j], fps[j], lease, keep, viewOf(r.rec), r.acquired, r.err)
		if r.err != nil {
			mc.fatalf(t, "concurrent Acquire: %v", r.err)
		}
		if r.acquired {
			winner = j
			winners++
		}
	}
	if winners > 1 {
		// Only in turn: each lease lapsed before the next took over, so
		// the calls lasted longer than the lease and no keep held it.
		if end.Add(mc.tg.margin).Before(start.Add(lease + keep.Uncertain)) {
			mc.fatalf(t, "concurrent Acquire: %d of %v acquired k%d within its %v lease", winners, toks, i, lease)
		}
		mc.stats["ConcurrentAcquire → takeovers in turn"]++
		// The model follows the record the store now holds.
		got, found, err := mc.tg.store.Get(mc.ctx, mc.keys[i])
		after := mc.tg.clk.Now()
		if err != nil {
			mc.fatalf(t, "Get: %v", err)
		}
		mc.m[i], mc.pres[i] = rec{}, presMaybe
		for j, r := range res {
			if r.acquired && found && got.Token == toks[j] && got.State == idem.StateInProgress {
				mc.m[i] = rec{state: idem.StateInProgress, token: toks[j], fp: fps[j], keep: keep, lo: start.Add(lease), hi: after.Add(lease)}
			}
		}
		return
	}
	mc.logf(t, "ConcurrentAcquire(k%d, %v) winner %d [model %s]", i, toks, winner, mc.m[i].view())
	cs := mc.cands(i, start, end)
	// Losers see a candidate (before the winner) or the winner's record.
	// (in any of its phases: a loser may end after the winner's lease).
	seen := cs
	if winner >= 0 {
		won := rec{state: idem.StateInProgress, token: toks[winner], fp: fps[winner], keep: keep, lo: start.Add(lease), hi: end.Add(lease)}
		for r := won; r.state != 0; r = r.next() {
			if start.Add(-mc.tg.margin).Before(r.hi) {
				seen = append(seen, r)
			}
		}
	}
	for j, r := range res {
		if j == winner {
			continue
		}
		ok := false
		for _, c := range seen {
			if e := mc.acquireEffect(c, toks[j], fps[j], lease, keep, start, end); e.answer == acquireAnswer(r.rec, false, nil) {
				ok = true
			}
		}
		if !ok {
			mc.fatalf(t, "concurrent Acquire loser %s returned %s; model %s", toks[j], viewOf(r.rec), mc.m[i].view())
		}
	}
	if winner < 0 {
		mc.stats["ConcurrentAcquire → none acquired"]++
		if cs[len(cs)-1].state == 0 && len(cs) == 1 {
			mc.fatalf(t, "concurrent Acquire on a free key: nobody acquired")
		}
		return // every candidate unchanged; Check resyncs
	}
	mc.decide(t, "ConcurrentAcquire", i, start, end, "acquired", func(c rec) effect {
		return mc.acquireEffect(c, toks[winner], fps[winner], lease, keep, start, end)
	})
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
		if mc.pres[i] == presYes && mc.cands(i, now, now)[0].state == 0 {
			want++
			mc.pres[i] = presNo
		}
	}
	got := mc.tg.mem.Cleanup()
	mc.logf(t, "Cleanup() = %d [model %d]", got, want)
	mc.stats[fmt.Sprintf("Cleanup deleted>0=%v", got > 0)]++
	if got != want {
		mc.fatalf(t, "Cleanup deleted %d records, model has %d expired", got, want)
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
			mc.fatalf(t, "memstore Len() = %d, model holds %d records", got, want)
		}
	}
}

// run checks newTarget's stores against the model with checks random
// sequences (unless -rapid.checks or RAPID_CHECKS says otherwise).
func run(t *testing.T, checks int, newTarget func(t *rapid.T) *target) {
	setChecks(checks)
	start := time.Now()
	n := 0
	stats := map[string]int{}
	rapid.Check(t, func(rt *rapid.T) {
		n++
		ctx, cancel := sequenceContext()
		defer cancel()
		tg := newTarget(rt)
		if tg.reset != nil {
			tg.reset()
		}
		mc := &machine{tg: tg, ctx: ctx, m: make([]rec, 3), pres: make([]presence, 3), stats: stats}
		for range mc.m {
			mc.keys = append(mc.keys, storetest.Key())
		}
		rt.Repeat(rapid.StateMachineActions(mc))
	})
	t.Logf("%d sequences (shrinking included) in %v; outcomes [op, exact or near a phase end, answer]:", n, time.Since(start).Round(time.Millisecond))
	for _, k := range slices.Sorted(maps.Keys(stats)) {
		t.Logf("  %-50s %6d", k, stats[k])
	}
}

// sequenceContext bounds one sequence's store calls: minutes for tens of
// calls, so that only a store that stopped answering ends it, however many
// sequences a run has (-rapid.checks) and however loaded the machine.
func sequenceContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Minute)
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
			store: s, mem: s, maxRecords: max, clk: clk, reacquire: reacquireNone,
			leases:     []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, time.Hour},
			retentions: []time.Duration{time.Second, 3 * time.Second, 24 * time.Hour},
			keeps:      []time.Duration{0, 0, time.Second, 4 * time.Second, time.Hour},
			advances:   []time.Duration{time.Millisecond, 500 * time.Millisecond, time.Second, 2*time.Second - time.Nanosecond, 3 * time.Second},
		}
	})
}

// Real-clock stores: short leases and sleeps, a margin for scheduling jitter
// and (MongoDB) millisecond dates and the server clock offset.
var (
	realLeases     = []time.Duration{60 * time.Millisecond, 120 * time.Millisecond, time.Hour, time.Hour}
	realRetentions = []time.Duration{80 * time.Millisecond, time.Hour}
	realKeeps      = []time.Duration{0, 0, 70 * time.Millisecond, time.Hour}
	realAdvances   = []time.Duration{10 * time.Millisecond, 30 * time.Millisecond, 60 * time.Millisecond}
)

const realMargin = 25 * time.Millisecond
