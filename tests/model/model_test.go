package model_test

import (
	"bytes"
	"cmp"
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
// Cleanup) and of its step journal (StartStep, FinishStep, Suspend, Steps,
// and Acquire's takeover report), clock advances and concurrent duplicate
// acquires over a few keys and tokens, and checks every answer against a
// reference model of one record per key. A record goes through phases:
//
//	absent → in-progress (token, fingerprint, lease, keep, journal) → completed (response, retention)
//	in-progress --lease lapses--> uncertain (Keep.Uncertain > 0) --keep ends--> expired (= absent)
//	in-progress with a journal --lease lapses--> lapsed (kept for its retain) --retain ends--> absent
//	completed --retention ends--> tombstone, StateExpired (Keep.Tombstone > 0) --keep ends--> absent
//
// plus Release and Resolve(nil) (→ absent), Resolve(response) (uncertain →
// completed), Extend (new lease; an uncertain record's owner renews it back
// to in-progress), Evict (the inspected record → absent), Suspend (the
// holder's record → uncertain for its keep) and an Acquire that takes a
// lapsed record over (its journal kept with the fingerprint, refused to
// another; the previous holder reported). A lapsed record without a
// journal is absent, its row perhaps still there (a "ghost": an Acquire
// may report taking it over).
//
// Actions contend: most draw a key whose record is in progress or
// uncertain, the token of its holder or of its former holder (fenced off
// after a takeover), and a step its journal holds; actions that need a
// record wait (are skipped) while none is held. The run logs how many
// actions met a record in progress (its lease live or lapsed) or
// uncertain, apart from the total.
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
	retains                             []time.Duration // of StartStep and SetRecovery
	backoffs                            []time.Duration // of Claim

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
	// sent again finds its own value: token, fingerprint and keep), unless
	// the record was written since (a journal entry, Suspend): then held.
	reacquireSame
	// reacquireReplace: in progress (its lease live or lapsed) or
	// uncertain, acquired, the record written again with the call's
	// fingerprint, lease and keep, its journal kept when the fingerprint
	// is the record's, no takeover reported (pgstore, mysqlstore: the
	// acquire statement treats the token's own row as free).
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

	// steps is the record's step journal (idem.Journal); retain, the
	// largest retain of the StartSteps that created its entries.
	steps  []idem.StepEntry
	retain time.Duration
	// lapsed: an in-progress record whose lease lapsed, kept with its
	// journal for retain (taken over by the next Acquire with its
	// fingerprint, refused to another, fenced against every holder).
	lapsed bool
	// rewritten: a journal write, SetRecovery, Suspend or ResolveStep
	// rewrote it since its Acquire (the stored record is no longer what an
	// Acquire writes: no same-token re-acquire, reacquireSame).
	rewritten bool
	// payload is the recovery payload (idem.Recoverable, "": none);
	// payloadMaybe: Suspend may have dropped it; attempts and backoff are
	// its claims' count and the last claim's backoff; leaseLo, leaseHi
	// (lapsed only) the window in which the lapsed lease ended.
	payload          string
	payloadMaybe     bool
	attempts         int
	backoff          time.Duration
	leaseLo, leaseHi time.Time
	// ghost (absent only): the token of the in-progress or uncertain
	// record whose lapse or keep ended, whose row the store may still
	// hold: an Acquire may report taking it over ("*": any token).
	ghost string
}

// next is the phase after r ends: uncertain, lapsed (kept for its
// journal), tombstone, or absent.
func (r rec) next() rec {
	switch {
	case r.state == idem.StateInProgress && !r.lapsed && r.keep.Uncertain > 0:
		return rec{state: idem.StateUncertain, token: r.token, fp: r.fp, keep: r.keep, steps: r.steps, retain: r.retain, rewritten: r.rewritten,
			payload: r.payload, payloadMaybe: r.payload != "", attempts: r.attempts, backoff: r.backoff, lo: r.lo.Add(r.keep.Uncertain), hi: r.hi.Add(r.keep.Uncertain)}
	case r.state == idem.StateInProgress && !r.lapsed && r.kept():
		n := r
		n.lapsed, n.lo, n.hi, n.leaseLo, n.leaseHi = true, r.lo.Add(r.retain), r.hi.Add(r.retain), r.lo, r.hi
		return n
	case r.state == idem.StateInProgress || r.state == idem.StateUncertain:
		return rec{ghost: r.token}
	case r.state == idem.StateCompleted && r.keep.Tombstone > 0:
		return rec{state: idem.StateExpired, fp: r.fp, keep: r.keep, lo: r.lo.Add(r.keep.Tombstone), hi: r.hi.Add(r.keep.Tombstone)}
	}
	return rec{}
}

// same reports whether a and b are the same record, windows (and ghosts)
// aside.
func same(a, b rec) bool {
	return a.state == b.state && a.token == b.token && a.fp == b.fp && bytes.Equal(a.resp, b.resp) && a.keep == b.keep &&
		a.lapsed == b.lapsed && a.rewritten == b.rewritten && a.retain == b.retain && stepsView(a.steps) == stepsView(b.steps) &&
		a.payload == b.payload && a.payloadMaybe == b.payloadMaybe && a.attempts == b.attempts && a.backoff == b.backoff
}

// samePayloadAside is same, but for the recovery payload (and its
// attempts and backoff) that one of a and b may hold, or both, one of them
// perhaps dropped.
func samePayloadAside(a, b rec) bool {
	if a.payload != "" && b.payload != "" && (a.payload != b.payload || a.attempts != b.attempts || a.backoff != b.backoff) {
		return false
	}
	a.payload, a.payloadMaybe, a.attempts, a.backoff = "", false, 0, 0
	b.payload, b.payloadMaybe, b.attempts, b.backoff = "", false, 0, 0
	return same(a, b)
}

// kept reports whether r outlives a lapse of its lease (for its retain):
// a step was started in it, or a recovery payload set (its journal may
// have been emptied since by ResolveStep).
func (r rec) kept() bool { return r.retain > 0 }

// stepsView is a journal as a string: "none", or each entry's name,
// starting token, and result when done.
func stepsView(steps []idem.StepEntry) string {
	if len(steps) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, e := range steps {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s/%s", e.Name, e.Token)
		if e.Done {
			fmt.Fprintf(&b, "=%q", e.Result)
		}
	}
	return b.String()
}

// journalView is what Steps answers for r: its journal while it is live
// and not a tombstone.
func (r rec) journalView() string {
	if r.state == 0 || r.state == idem.StateExpired {
		return "none"
	}
	return stepsView(r.steps)
}

// describe is r for the log: its view, and whether its lease lapsed and
// its journal.
func (r rec) describe() string {
	d := r.view()
	if r.lapsed {
		d += " (lapsed)"
	}
	if r.rewritten {
		d += " (rewritten)"
	}
	if len(r.steps) > 0 {
		d += " steps " + stepsView(r.steps)
	}
	if r.payload != "" {
		d += fmt.Sprintf(" payload %q attempts %d backoff %v", r.payload, r.attempts, r.backoff)
		if r.payloadMaybe {
			d += " (maybe dropped)"
		}
	}
	if r.ghost != "" {
		d += " (ghost " + r.ghost + ")"
	}
	return d
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
	alt    string // another answer ("": none), with the same effect unless altNext
	// altNext, when not nil, is the record after the alt answer.
	altNext *rec
	next    rec
	pres    presence // presNo: delete the row, presYes: write one, presMaybe: leave it
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
	// checking: Check's reads, not counted among the actions' targets.
	checking bool
	// former is each key's holder before its current one (or its last).
	former []string
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
	r := mc.m[i]
	for ; r.state != 0; r = r.next() {
		if start.Add(-mc.tg.margin).Before(r.hi) {
			out = append(out, r)
		}
		if end.Add(mc.tg.margin).Before(r.lo) {
			return out
		}
	}
	return append(out, r) // absent, with its ghost
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
		want := e.answer
		if e.alt != "" {
			want += " | " + e.alt
		}
		wants = append(wants, fmt.Sprintf("[%s: %s]", c.describe(), want))
		if matches(e, got) {
			if e.answer != got && e.altNext != nil {
				e.next = *e.altNext
			}
			match, effs = append(match, c), append(effs, e)
		}
	}
	kind := "exact"
	if len(cs) > 1 {
		kind = "near"
	}
	mc.stats[fmt.Sprintf("%s %s → %s", op, kind, short(got))]++
	if !mc.checking {
		mc.stats[targetOf(cs[0])]++
	}
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
		if !same(e.next, n) && samePayloadAside(e.next, n) {
			// kept or not (a takeover around its retain's end, a payload
			// dropped or kept as it turned uncertain): a Claim tells
			if n.payload == "" {
				n.payload, n.attempts, n.backoff = e.next.payload, e.next.attempts, e.next.backoff
			}
			n.payloadMaybe = true
			e.next = n
		}
		if !same(e.next, n) {
			mc.fatalf(t, "%s(k%d) = %s: ambiguous, candidates lead to %s and %s", op, i, got, n.describe(), e.next.describe())
		}
		if n.state != 0 {
			n.lo, n.hi = minTime(n.lo, e.next.lo), maxTime(n.hi, e.next.hi)
		}
		if n.state == 0 && n.ghost != e.next.ghost {
			n.ghost = cmp.Or(n.ghost, e.next.ghost)
			if e.next.ghost != "" && e.next.ghost != n.ghost {
				n.ghost = "*"
			}
		}
		if e.pres != p {
			p = presMaybe
			mc.pres[i] = presMaybe // written by one candidate, left or deleted by another
		}
	}
	if old := mc.m[i].token; old != "" && old != n.token {
		mc.former[i] = old
	}
	mc.m[i] = n
	if p != presMaybe {
		mc.pres[i] = p
	}
}

// Targets of the actions, by the record they find (the current phase at
// their start): contended ones find it in progress, its lease live or
// lapsed, or uncertain.
const (
	targetLive      = "target: in progress, lease live"
	targetLapsed    = "target: in progress, lease lapsed"
	targetUncertain = "target: uncertain"
	targetCompleted = "target: completed or tombstone"
	targetAbsent    = "target: absent"
)

func targetOf(c rec) string {
	switch {
	case c.lapsed:
		return targetLapsed
	case c.state == idem.StateInProgress:
		return targetLive
	case c.state == idem.StateUncertain:
		return targetUncertain
	case c.state == 0:
		return targetAbsent
	}
	return targetCompleted
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
	// and its journal, when the candidates' journals differ
	journaled := false
	for _, e := range effs[1:] {
		journaled = journaled || e.next.journalView() != effs[0].next.journalView()
	}
	viewed := rec.view
	if j, ok := mc.tg.store.(idem.Journal); ok && journaled {
		steps, err := j.Steps(mc.ctx, mc.keys[i])
		if err != nil {
			mc.fatalf(t, "%s(k%d) = %s: Steps to tell the candidates apart: %v", op, i, got, err)
		}
		seen += " journal " + stepsView(steps)
		viewed = func(r rec) string { return r.view() + " journal " + r.journalView() }
	}
	mc.logf(t, "Get(k%d) = %s [to tell %d candidates apart]", i, seen, len(effs))
	at := mc.tg.clk.Now()
	var exact, later []effect
	for _, e := range effs {
		if viewed(e.next) == seen {
			exact = append(exact, e)
			continue
		}
		// a later phase, only once the phase before it can have ended
		for prev, r := e.next, e.next.next(); prev.state != 0 && !at.Add(mc.tg.margin).Before(prev.lo); prev, r = r, r.next() {
			if viewed(r) == seen {
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
// its live lease, or the record is uncertain and was its (Keep.Uncertain,
// Suspend).
func owns(c rec, token string) bool {
	return (c.state == idem.StateInProgress && !c.lapsed || c.state == idem.StateUncertain) && c.token == token
}

// leased reports whether token holds c's live lease: it may write the
// journal (StartStep, FinishStep, Suspend).
func leased(c rec, token string) bool {
	return c.state == idem.StateInProgress && !c.lapsed && c.token == token
}

// acquireEffect is what Acquire(token, fp, lease, keep) over [start, end]
// does to candidate c.
func (mc *machine) acquireEffect(c rec, tok, fp string, lease time.Duration, keep idem.Keep, start, end time.Time) effect {
	fresh := rec{state: idem.StateInProgress, token: tok, fp: fp, keep: keep, lo: start.Add(lease), hi: end.Add(lease)}
	switch {
	case c.state == 0:
		e := effect{answer: "acquired", next: fresh, pres: presYes}
		if c.ghost != "" {
			e.alt = "acquired over " + c.ghost
		}
		return e
	case (c.state == idem.StateInProgress || c.state == idem.StateUncertain) && mc.tg.reacquire == reacquireReplace && c.token == tok:
		// its own row, live, uncertain or lapsed: written again, its
		// journal kept with the fingerprint (a retried acquire resumes)
		if c.fp == fp {
			fresh.resume(c)
		}
		return effect{answer: "acquired", next: fresh, pres: presYes}
	case c.lapsed && (c.fp == fp || len(c.steps) == 0): // a takeover: the journal (its retain, the payload) go on
		e := effect{answer: "acquired over " + c.token, next: fresh, pres: presYes}
		if c.fp == fp {
			e.next.resume(c)
		} else {
			// no journal (a payload, or one ResolveStep emptied): taken
			// over by another fingerprint, or still refused to it (the
			// contract leaves it to the store: memstore refuses a payload
			// record, redisstore an emptied journal's)
			e.alt, e.altNext = "held: "+c.view(), &c
		}
		return e
	case c.lapsed: // refused to another fingerprint: the journal (or payload) left effects
	case (c.state == idem.StateInProgress || c.state == idem.StateUncertain) && mc.tg.reacquire == reacquireSame && !c.rewritten && len(c.steps) == 0 && c.payload == "" &&
		c.token == tok && c.fp == fp && c.keep == keep:
		e := keepAs(c)
		e.answer = "acquired"
		return e
	}
	e := keepAs(c)
	e.answer = "held: " + c.view()
	return e
}

// resume makes r, a new holder's record, go on with c's journal, retain
// and recovery payload (a takeover with c's fingerprint).
func (r *rec) resume(c rec) {
	r.steps, r.retain, r.payload, r.payloadMaybe, r.attempts, r.backoff = c.steps, c.retain, c.payload, c.payloadMaybe, c.attempts, c.backoff
}

// acquireAnswer is an Acquire's answer: "acquired", "acquired over"
// the token whose lapsed lease it took over, "held:" the live record, or
// the error.
func acquireAnswer(got idem.Record, acquired bool, err error) string {
	switch {
	case err != nil:
		return errAnswer(err)
	case acquired && got.Token != "":
		return "acquired over " + got.Token
	case acquired:
		return "acquired"
	}
	return "held: " + viewOf(got)
}

// matches reports whether the store's answer got is e's (a ghost "*"
// allows a takeover of any token).
func matches(e effect, got string) bool {
	return e.answer == got || e.alt != "" && (e.alt == got || e.alt == "acquired over *" && strings.HasPrefix(got, "acquired over "))
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

// contend skips an action that needs a record to act on while no key
// holds one (before any draw: rapid then picks another action), so that
// the actions that end records (Complete, Release, Resolve, Suspend) do
// not leave most of a sequence acting on absent keys.
func (mc *machine) contend(t *rapid.T) {
	for _, r := range mc.m {
		if r.state == idem.StateInProgress || r.state == idem.StateUncertain {
			return
		}
	}
	t.Skip("no record in progress or uncertain")
}

// drawKey draws the key of an action: mostly one whose record is in
// progress (its lease live or lapsed) or uncertain, when there is one, so
// that most actions contend for a held record rather than land on a
// completed or absent one.
func (mc *machine) drawKey(t *rapid.T) int {
	var held []int
	for i, r := range mc.m {
		if r.state == idem.StateInProgress || r.state == idem.StateUncertain {
			held = append(held, i)
		}
	}
	if len(held) > 0 && rapid.IntRange(0, 3).Draw(t, "contend") > 0 {
		return rapid.SampledFrom(held).Draw(t, "held key")
	}
	return rapid.IntRange(0, len(mc.keys)-1).Draw(t, "key")
}

// drawStep draws a step name: mostly one the key's journal holds.
func (mc *machine) drawStep(t *rapid.T, i int) string {
	if st := mc.m[i].steps; len(st) > 0 && rapid.IntRange(0, 2).Draw(t, "started step") > 0 {
		return rapid.SampledFrom(st).Draw(t, "step").Name
	}
	return rapid.SampledFrom(stepNames).Draw(t, "step")
}

// drawToken draws the token of an action on key i: mostly its holder's
// (or last holder's) or the one it had before, so that most actions
// contend for the record and former holders are fenced off.
func (mc *machine) drawToken(t *rapid.T, i int) string {
	switch rapid.IntRange(0, 3).Draw(t, "whose") {
	case 0, 1:
		if tok := mc.m[i].token; tok != "" {
			return tok
		}
	case 2:
		if tok := mc.former[i]; tok != "" {
			return tok
		}
	}
	return rapid.SampledFrom(tokens).Draw(t, "token")
}

func (mc *machine) drawKeep(t *rapid.T) idem.Keep {
	return idem.Keep{Uncertain: drawDur(t, mc.tg.keeps, "uncertain"), Tombstone: drawDur(t, mc.tg.keeps, "tombstone")}
}

func (mc *machine) Acquire(t *rapid.T) {
	i := mc.drawKey(t)
	tok := mc.drawToken(t, i)
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
	mc.logf(t, "AcquireKeep(k%d, %s, %.4s, %v, %+v) = %s, %v, %v [model %s]", i, tok, fp, lease, keep, viewOf(got), acquired, err, mc.m[i].describe())

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
	if acquired && got.Token != "" && (got.State != idem.StateInProgress || got.LeaseLeft >= 0) {
		mc.fatalf(t, "Acquire reported a takeover of %s as %v with LeaseLeft %v; want in-progress, < 0", got.Token, got.State, got.LeaseLeft)
	}
	mc.decide(t, "Acquire", i, start, end, acquireAnswer(got, acquired, err), func(c rec) effect {
		return mc.acquireEffect(c, tok, fp, lease, keep, start, end)
	})
}

func (mc *machine) Complete(t *rapid.T) {
	mc.contend(t)
	i := mc.drawKey(t)
	tok := mc.drawToken(t, i)
	ri := rapid.IntRange(0, len(responses)-1).Draw(t, "response")
	ret := drawDur(t, mc.tg.retentions, "retention")

	start := mc.tg.clk.Now()
	err := mc.tg.store.Complete(mc.ctx, mc.keys[i], tok, responses[ri], ret)
	end := mc.tg.clk.Now()
	mc.logf(t, "Complete(k%d, %s, r%d, %v) = %v [model %s]", i, tok, ri, ret, err, mc.m[i].describe())
	mc.decide(t, "Complete", i, start, end, errAnswer(err), func(c rec) effect {
		if !owns(c, tok) {
			e := keepAs(c)
			e.answer = "ErrNotOwner"
			return e
		}
		return effect{answer: "ok", pres: presYes, next: rec{state: idem.StateCompleted, token: tok, fp: c.fp, resp: slices.Clone(responses[ri]), keep: c.keep, steps: c.steps, lo: start.Add(ret), hi: end.Add(ret)}}
	})
}

func (mc *machine) Release(t *rapid.T) {
	mc.contend(t)
	i := mc.drawKey(t)
	tok := mc.drawToken(t, i)

	start := mc.tg.clk.Now()
	err := mc.tg.store.Release(mc.ctx, mc.keys[i], tok)
	end := mc.tg.clk.Now()
	mc.logf(t, "Release(k%d, %s) = %v [model %s]", i, tok, err, mc.m[i].describe())
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
	mc.contend(t)
	i := mc.drawKey(t)
	tok := mc.drawToken(t, i)
	lease := drawDur(t, mc.tg.leases, "lease")

	start := mc.tg.clk.Now()
	err := mc.tg.store.(idem.Extender).Extend(mc.ctx, mc.keys[i], tok, lease)
	end := mc.tg.clk.Now()
	mc.logf(t, "Extend(k%d, %s, %v) = %v [model %s]", i, tok, lease, err, mc.m[i].describe())
	mc.decide(t, "Extend", i, start, end, errAnswer(err), func(c rec) effect {
		if !owns(c, tok) {
			e := keepAs(c)
			e.answer = "ErrNotOwner"
			return e
		}
		return effect{answer: "ok", pres: presYes, next: rec{state: idem.StateInProgress, token: tok, fp: c.fp, keep: c.keep, steps: c.steps, retain: c.retain, rewritten: c.rewritten,
			payload: c.payload, payloadMaybe: c.payloadMaybe, attempts: c.attempts, backoff: c.backoff, lo: start.Add(lease), hi: end.Add(lease)}}
	})
}

// Resolve ends an uncertain record: nil response deletes it, else it
// completes with the response.
func (mc *machine) Resolve(t *rapid.T) {
	mc.contend(t)
	i := mc.drawKey(t)
	ri := rapid.IntRange(-1, len(responses)-1).Draw(t, "response")
	ret := drawDur(t, mc.tg.retentions, "retention")
	var resp []byte
	if ri >= 0 {
		resp = responses[ri]
	}

	start := mc.tg.clk.Now()
	err := mc.tg.store.(idem.Keeper).Resolve(mc.ctx, mc.keys[i], resp, ret)
	end := mc.tg.clk.Now()
	mc.logf(t, "Resolve(k%d, r%d, %v) = %v [model %s]", i, ri, ret, err, mc.m[i].describe())
	mc.decide(t, "Resolve", i, start, end, errAnswer(err), func(c rec) effect {
		switch {
		case c.state != idem.StateUncertain:
			e := keepAs(c)
			e.answer = "ErrRecordChanged"
			return e
		case resp == nil:
			return effect{answer: "ok", pres: presNo}
		}
		return effect{answer: "ok", pres: presYes, next: rec{state: idem.StateCompleted, token: c.token, fp: c.fp, resp: slices.Clone(resp), keep: c.keep, steps: c.steps, lo: start.Add(ret), hi: end.Add(ret)}}
	})
}

// Step names and results of the journal actions.
var (
	stepNames   = []string{"charge", "email", "ledger"}
	stepResults = [][]byte{[]byte(`{"id":"ch_1"}`), {}, {0, 0xff}}
)

func (mc *machine) journal(t *rapid.T) idem.Journal {
	j, ok := mc.tg.store.(idem.Journal)
	if !ok {
		t.Skip("not a Journal")
	}
	return j
}

// StartStep starts (or returns) a step of the record whose live lease the
// token holds; a new entry raises the record's retain.
func (mc *machine) StartStep(t *rapid.T) {
	mc.contend(t)
	j := mc.journal(t)
	i := mc.drawKey(t)
	tok := mc.drawToken(t, i)
	name := mc.drawStep(t, i)
	retain := drawDur(t, mc.tg.retains, "retain")

	start := mc.tg.clk.Now()
	got, err := j.StartStep(mc.ctx, mc.keys[i], tok, name, retain)
	end := mc.tg.clk.Now()
	answer := errAnswer(err)
	if err == nil {
		answer = "entry " + stepsView([]idem.StepEntry{got})
		if got.Name != name || !got.Done && got.Result != nil {
			mc.fatalf(t, "StartStep(k%d, %s) returned %+v", i, name, got)
		}
	}
	mc.logf(t, "StartStep(k%d, %s, %s, %v) = %s [model %s]", i, tok, name, retain, answer, mc.m[i].describe())
	mc.decide(t, "StartStep", i, start, end, answer, func(c rec) effect {
		if !leased(c, tok) {
			e := keepAs(c)
			e.answer = "ErrNotOwner"
			return e
		}
		for _, st := range c.steps {
			if st.Name == name {
				e := keepAs(c)
				e.answer = "entry " + stepsView([]idem.StepEntry{st})
				return e
			}
		}
		st := idem.StepEntry{Name: name, Token: tok}
		n := c
		n.steps, n.retain, n.rewritten = append(slices.Clip(c.steps), st), max(c.retain, retain), true
		return effect{answer: "entry " + stepsView([]idem.StepEntry{st}), next: n, pres: presYes}
	})
}

// FinishStep marks a started step done, once: a done one stays as it was.
func (mc *machine) FinishStep(t *rapid.T) {
	mc.contend(t)
	j := mc.journal(t)
	i := mc.drawKey(t)
	tok := mc.drawToken(t, i)
	name := mc.drawStep(t, i)
	ri := rapid.IntRange(0, len(stepResults)-1).Draw(t, "result")

	start := mc.tg.clk.Now()
	err := j.FinishStep(mc.ctx, mc.keys[i], tok, name, stepResults[ri])
	end := mc.tg.clk.Now()
	mc.logf(t, "FinishStep(k%d, %s, %s, %q) = %v [model %s]", i, tok, name, stepResults[ri], err, mc.m[i].describe())
	mc.decide(t, "FinishStep", i, start, end, errAnswer(err), func(c rec) effect {
		e := keepAs(c)
		e.answer = "ErrNotOwner"
		if !leased(c, tok) {
			return e
		}
		for k, st := range c.steps {
			if st.Name != name {
				continue
			}
			e.answer = "ok"
			if !st.Done {
				n := c
				n.steps = slices.Clone(c.steps)
				n.steps[k].Done, n.steps[k].Result, n.rewritten = true, slices.Clone(stepResults[ri]), true
				return effect{answer: "ok", next: n, pres: presYes}
			}
		}
		return e
	})
}

// Suspend turns the record whose live lease the token holds uncertain for
// keep, its token and journal kept.
func (mc *machine) Suspend(t *rapid.T) {
	mc.contend(t)
	j := mc.journal(t)
	i := mc.drawKey(t)
	tok := mc.drawToken(t, i)
	keep := drawDur(t, mc.tg.retentions, "keep")

	start := mc.tg.clk.Now()
	err := j.Suspend(mc.ctx, mc.keys[i], tok, keep)
	end := mc.tg.clk.Now()
	mc.logf(t, "Suspend(k%d, %s, %v) = %v [model %s]", i, tok, keep, err, mc.m[i].describe())
	mc.decide(t, "Suspend", i, start, end, errAnswer(err), func(c rec) effect {
		if !leased(c, tok) {
			e := keepAs(c)
			e.answer = "ErrNotOwner"
			return e
		}
		n := c
		n.state, n.keep.Uncertain, n.rewritten, n.lo, n.hi = idem.StateUncertain, keep, true, start.Add(keep), end.Add(keep)
		n.payloadMaybe = n.payload != "" // dropped as it turns uncertain, or kept (not due while uncertain)
		return effect{answer: "ok", next: n, pres: presYes}
	})
}

// Steps reads key i's journal.
func (mc *machine) Steps(t *rapid.T) {
	mc.contend(t)
	mc.journal(t)
	mc.steps(t, mc.drawKey(t))
}

// steps compares the store's journal of key i with the model's.
func (mc *machine) steps(t *rapid.T, i int) {
	start := mc.tg.clk.Now()
	got, err := mc.tg.store.(idem.Journal).Steps(mc.ctx, mc.keys[i])
	end := mc.tg.clk.Now()
	answer := errAnswer(err)
	if err == nil {
		answer = "journal " + stepsView(got)
		if got != nil && len(got) == 0 {
			mc.fatalf(t, "Steps(k%d) = an empty journal, not nil", i)
		}
	}
	mc.readBy(t, "Steps", i, start, end, answer, func(c rec) effect {
		e := keepAs(c)
		e.answer = "journal " + c.journalView()
		return e
	})
}

// payloads are recovery payloads (idem.Recoverable.SetRecovery).
var payloads = []string{"POST /pay body=1", "\x00\xffbinary"}

func (mc *machine) recoverable(t *rapid.T) idem.Recoverable {
	r, ok := mc.tg.store.(idem.Recoverable)
	if !ok {
		t.Skip("not Recoverable")
	}
	return r
}

// SetRecovery stores a recovery payload in the record whose live lease
// the token holds; it raises the record's retain.
func (mc *machine) SetRecovery(t *rapid.T) {
	mc.contend(t)
	r := mc.recoverable(t)
	i := mc.drawKey(t)
	tok := mc.drawToken(t, i)
	payload := rapid.SampledFrom(payloads).Draw(t, "payload")
	retain := drawDur(t, mc.tg.retains, "retain")

	start := mc.tg.clk.Now()
	err := r.SetRecovery(mc.ctx, mc.keys[i], tok, []byte(payload), retain)
	end := mc.tg.clk.Now()
	mc.logf(t, "SetRecovery(k%d, %s, %q, %v) = %v [model %s]", i, tok, payload, retain, err, mc.m[i].describe())
	mc.decide(t, "SetRecovery", i, start, end, errAnswer(err), func(c rec) effect {
		if !leased(c, tok) {
			e := keepAs(c)
			e.answer = "ErrNotOwner"
			return e
		}
		n := c
		n.payload, n.payloadMaybe, n.retain, n.rewritten = payload, false, max(c.retain, retain), true
		return effect{answer: "ok", next: n, pres: presYes}
	})
}

// due is whether c is due for recovery over [start, end]: "yes", "no" or
// "maybe" (its lapse plus backoff near the action).
func (mc *machine) due(c rec, start, end time.Time) string {
	if !c.lapsed || c.payload == "" || c.keep.Uncertain > 0 {
		return "no"
	}
	switch {
	case start.Add(-mc.tg.margin).After(c.leaseHi.Add(c.backoff)) && !c.payloadMaybe:
		return "yes"
	case end.Add(mc.tg.margin).Before(c.leaseLo.Add(c.backoff)):
		return "no"
	}
	return "maybe"
}

// Claim takes a due record over for a recoverer's token: its journal and
// payload kept, one more attempt counted, the previous holder reported.
func (mc *machine) Claim(t *rapid.T) {
	mc.contend(t)
	r := mc.recoverable(t)
	i := mc.drawKey(t)
	tok := mc.drawToken(t, i)
	lease := drawDur(t, mc.tg.leases, "lease")
	backoff := drawDur(t, mc.tg.backoffs, "backoff")

	start := mc.tg.clk.Now()
	got, claimed, err := r.Claim(mc.ctx, mc.keys[i], tok, lease, backoff)
	end := mc.tg.clk.Now()
	answer := errAnswer(err)
	switch {
	case err != nil:
	case claimed:
		answer = fmt.Sprintf("claimed %q fp=%.8s attempts=%d over %s", got.Payload, got.Fingerprint, got.Attempts, got.PreviousToken)
		if got.Lapsed <= 0 {
			mc.fatalf(t, "Claim(k%d) reported Lapsed %v, want > 0", i, got.Lapsed)
		}
	default:
		answer = "not claimed"
	}
	mc.logf(t, "Claim(k%d, %s, %v, %v) = %s [model %s]", i, tok, lease, backoff, answer, mc.m[i].describe())
	mc.decide(t, "Claim", i, start, end, answer, func(c rec) effect {
		no := keepAs(c)
		no.answer = "not claimed"
		due := mc.due(c, start, end)
		if due == "no" {
			return no
		}
		n := rec{state: idem.StateInProgress, token: tok, fp: c.fp, keep: c.keep, lo: start.Add(lease), hi: end.Add(lease)}
		n.resume(c)
		n.attempts, n.backoff, n.payloadMaybe = c.attempts+1, backoff, false
		e := effect{answer: fmt.Sprintf("claimed %q fp=%.8s attempts=%d over %s", c.payload, c.fp, n.attempts, c.token), next: n, pres: presYes}
		if due == "maybe" {
			e.alt, e.altNext = no.answer, &c
			if c.payloadMaybe { // dropped when it turned uncertain: never due again
				d := c
				d.payload, d.payloadMaybe = "", false
				e.altNext = &d
			}
		}
		return e
	})
}

// ResolveStep settles a started step of an uncertain record, or of one
// whose lease lapsed: done with a result, or removed (nil); the record is
// then in progress, its lease lapsed, for a takeover or a claim.
func (mc *machine) ResolveStep(t *rapid.T) {
	mc.contend(t)
	res, ok := mc.tg.store.(idem.StepResolver)
	if !ok {
		t.Skip("not a StepResolver")
	}
	i := mc.drawKey(t)
	name := mc.drawStep(t, i)
	ri := rapid.IntRange(-1, len(stepResults)-1).Draw(t, "result")
	var result []byte
	if ri >= 0 {
		result = stepResults[ri]
	}

	start := mc.tg.clk.Now()
	err := res.ResolveStep(mc.ctx, mc.keys[i], name, result)
	end := mc.tg.clk.Now()
	mc.logf(t, "ResolveStep(k%d, %s, %q) = %v [model %s]", i, name, result, err, mc.m[i].describe())
	mc.decide(t, "ResolveStep", i, start, end, errAnswer(err), func(c rec) effect {
		e := keepAs(c)
		e.answer = "ErrRecordChanged"
		if c.state != idem.StateUncertain && !c.lapsed {
			return e
		}
		k := slices.IndexFunc(c.steps, func(st idem.StepEntry) bool { return st.Name == name })
		if k < 0 || c.steps[k].Done {
			return e
		}
		n := c
		n.steps = slices.Clone(c.steps)
		if result == nil {
			n.steps = slices.Delete(n.steps, k, k+1)
		} else {
			n.steps[k].Done, n.steps[k].Result = true, slices.Clone(result)
		}
		n.state, n.lapsed, n.rewritten, n.keep.Uncertain = idem.StateInProgress, true, true, 0
		n.attempts, n.backoff = 0, 0 // an operator settled it: claims count from zero, due at once
		n.leaseLo, n.leaseHi, n.lo, n.hi = start, end, start.Add(c.retain), end.Add(c.retain)
		if c.payloadMaybe {
			// kept or dropped when it turned uncertain: a Claim tells
			n.payloadMaybe = true
		}
		return effect{answer: "ok", next: n, pres: presYes}
	})
}

// Lapsed lists the records due for recovery: each of the model's keys it
// lists may be due, with the model's attempts (it is a hint: a record
// listed may have changed since, which a later Check sees).
func (mc *machine) Lapsed(t *rapid.T) {
	r := mc.recoverable(t)
	start := mc.tg.clk.Now()
	got, err := r.Lapsed(mc.ctx, 100)
	end := mc.tg.clk.Now()
	if err != nil {
		mc.fatalf(t, "Lapsed: %v", err)
	}
	mc.stats[fmt.Sprintf("Lapsed listed>0=%v", len(got) > 0)]++
	for _, l := range got {
		i := slices.Index(mc.keys, l.Key)
		if i < 0 {
			continue
		}
		mc.logf(t, "Lapsed() lists k%d attempts %d [model %s]", i, l.Attempts, mc.m[i].describe())
		ok := false
		for _, c := range mc.cands(i, start, end) {
			ok = ok || mc.due(c, start, end) != "no" && c.attempts == l.Attempts
		}
		if !ok {
			mc.fatalf(t, "Lapsed() listed k%d (attempts %d), which the model holds not due", i, l.Attempts)
		}
	}
}

func (mc *machine) Get(t *rapid.T) {
	mc.get(t, mc.drawKey(t))
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
	mc.readBy(t, op, i, start, end, got, readEffect)
}

// readBy is read with the read's own answers (eff).
func (mc *machine) readBy(t *rapid.T, op string, i int, start, end time.Time, got string, eff func(rec) effect) {
	cs := mc.cands(i, start, end)
	mc.decide(t, op, i, start, end, got, eff)
	for _, c := range cs {
		if eff(c).answer == got && got != eff(cs[0]).answer {
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
	mc.contend(t)
	ins, ok := mc.tg.store.(idem.Inspector)
	if !ok {
		t.Skip("not an Inspector")
	}
	i := mc.drawKey(t)
	start := mc.tg.clk.Now()
	info, found, err := ins.Inspect(mc.ctx, mc.keys[i])
	end := mc.tg.clk.Now()
	mc.logf(t, "Inspect(k%d) = %s TTL %v, %v, %v [model %s]", i, viewOf(info.Record), info.TTL, found, err, mc.m[i].describe())
	if found {
		// TTL: the time to the end of the phase, by the store's clock; a
		// lapsed lease's, <= 0 (an operator sees it lapsed, not held for
		// its journal's retain).
		ok, ends := false, time.Duration(0)
		for _, x := range mc.cands(i, start, end) {
			if x.view() != viewOf(info.Record) {
				continue
			}
			ends = x.hi.Sub(start)
			ok = ok || x.lapsed && info.TTL <= mc.tg.margin ||
				!x.lapsed && info.TTL >= -mc.tg.margin && info.TTL <= ends+mc.tg.margin+time.Millisecond
		}
		if !ok {
			mc.fatalf(t, "Inspect(k%d) TTL %v, the phase ends within %v", i, info.TTL, ends)
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
	mc.logf(t, "Evict(k%d, %s) = %v [model %s]", i, viewOf(seen), err, mc.m[i].describe())
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
			case len(listed) == 1 && listed[0].Key == key && listed[0].Response == nil && viewOf(listed[0].Record) == want &&
				(listed[0].TTL > -mc.tg.margin || c.lapsed && listed[0].TTL <= mc.tg.margin):
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
		mc.logf(t, "List(k%d, state %v) = %s [model %s]", i, state, got, mc.m[i].describe())
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
			mc.m[i], mc.pres[i] = rec{}, presNo // no row left to report a takeover of
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
	i := mc.drawKey(t)
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
		retain := mc.m[i].retain
		mc.m[i], mc.pres[i] = rec{ghost: "*"}, presMaybe
		for j, r := range res {
			if r.acquired && found && got.Token == toks[j] && got.State == idem.StateInProgress {
				mc.m[i] = rec{state: idem.StateInProgress, token: toks[j], fp: fps[j], keep: keep, lo: start.Add(lease), hi: after.Add(lease)}
				if j, ok := mc.tg.store.(idem.Journal); ok { // the journal a takeover kept
					steps, err := j.Steps(mc.ctx, mc.keys[i])
					if err != nil {
						mc.fatalf(t, "Steps: %v", err)
					}
					if len(steps) > 0 {
						mc.m[i].steps, mc.m[i].retain = steps, retain
					}
				}
			}
		}
		return
	}
	mc.logf(t, "ConcurrentAcquire(k%d, %v) winner %d [model %s]", i, toks, winner, mc.m[i].describe())
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
			if e := mc.acquireEffect(c, toks[j], fps[j], lease, keep, start, end); matches(e, acquireAnswer(r.rec, false, nil)) {
				ok = true
			}
		}
		if !ok {
			mc.fatalf(t, "concurrent Acquire loser %s returned %s; model %s", toks[j], viewOf(r.rec), mc.m[i].describe())
		}
	}
	if winner < 0 {
		mc.stats["ConcurrentAcquire → none acquired"]++
		if cs[len(cs)-1].state == 0 && len(cs) == 1 {
			mc.fatalf(t, "concurrent Acquire on a free key: nobody acquired")
		}
		return // every candidate unchanged; Check resyncs
	}
	mc.decide(t, "ConcurrentAcquire", i, start, end, acquireAnswer(res[winner].rec, true, nil), func(c rec) effect {
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
			mc.m[i], mc.pres[i] = rec{}, presNo
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
	mc.checking = true
	defer func() { mc.checking = false }()
	_, journaled := mc.tg.store.(idem.Journal)
	for i := range mc.keys {
		mc.get(t, i)
		if journaled && (mc.tg.mem != nil || slices.ContainsFunc(mc.cands(i, mc.tg.clk.Now(), mc.tg.clk.Now()), func(c rec) bool { return len(c.steps) > 0 })) {
			mc.steps(t, i)
		}
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	n := 0
	stats := map[string]int{}
	rapid.Check(t, func(rt *rapid.T) {
		n++
		tg := newTarget(rt)
		if tg.reset != nil {
			tg.reset()
		}
		mc := &machine{tg: tg, ctx: ctx, m: make([]rec, 3), pres: make([]presence, 3), former: make([]string, 3), stats: stats}
		for range mc.m {
			mc.keys = append(mc.keys, storetest.Key())
		}
		rt.Repeat(rapid.StateMachineActions(mc))
	})
	t.Logf("%d sequences (shrinking included) in %v; outcomes [op, exact or near a phase end, answer]:", n, time.Since(start).Round(time.Millisecond))
	for _, k := range slices.Sorted(maps.Keys(stats)) {
		t.Logf("  %-50s %6d", k, stats[k])
	}
	total := stats[targetLive] + stats[targetLapsed] + stats[targetUncertain] + stats[targetCompleted] + stats[targetAbsent]
	contended := stats[targetLive] + stats[targetLapsed] + stats[targetUncertain]
	t.Logf("contention: %d of %d operations contended (%d.%d%%): %d on a live lease, %d on a lapsed lease, %d on an uncertain record; %d on completed records, %d on absent ones",
		contended, total, 100*contended/max(total, 1), 1000*contended/max(total, 1)%10, stats[targetLive], stats[targetLapsed], stats[targetUncertain], stats[targetCompleted], stats[targetAbsent])
}

func TestModelMemstore(t *testing.T) {
	run(t, 700, func(rt *rapid.T) *target {
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
			retains:    []time.Duration{time.Second, 3 * time.Second, time.Hour},
			backoffs:   []time.Duration{0, time.Second, time.Hour},
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
	// An hour: a lapsed record's retain never ends within a sequence on a
	// real clock (an Acquire near that end could not tell the records
	// apart, journal and payload kept or gone); memstore's fake clock
	// checks the retain's end exactly.
	realRetains  = []time.Duration{time.Hour}
	realBackoffs = []time.Duration{0, 50 * time.Millisecond, time.Hour}
	realAdvances = []time.Duration{10 * time.Millisecond, 30 * time.Millisecond, 60 * time.Millisecond}
)

const realMargin = 25 * time.Millisecond
