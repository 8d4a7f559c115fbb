package linear

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	idem "github.com/idemkit/idem/core"
)

// The sequential model of one record, without time: every lease,
// retention, retain and keep in the histories is an hour, far longer than
// a history, so no lease lapses and no record expires by itself. A lease
// ends only by a lapse (history_test.go): its holder's "shorten", an
// Extend to a millisecond (the record in progress, its lease live for that
// millisecond), and an "expire" the recorder adds, from the shorten's
// invocation to a wait past its return: the lease's end, somewhere in
// there, after the shorten; porcupine places both like any other call, and
// an expire that finds another lease (placed before its shorten, or the
// holder ended or renewed it) changes nothing. The record's state is
// thus a function of the calls alone, whatever the machine's load. A lapsed record with a
// journal or a recovery payload stays, in progress, its lease lapsed:
// taken over by the next Acquire with its fingerprint (reported with the
// previous token), refused to another, claimed by a recoverer, fenced
// against every holder; one without is absent, its row perhaps still there
// (a takeover of it may be reported); one acquired under a keep, or
// suspended, turns uncertain. Expiry of completed and uncertain records
// is time-dependent and checked elsewhere: tests/model runs every store
// against models with explicit expiry windows and explicit lapses.

// input is one call on a key.
type input struct {
	Op      string `json:"op"` // acquire, complete, release, extend, shorten, expire, get, startstep, finishstep, suspend, steps, setrecovery, claim, resolvestep
	Key     int    `json:"key"`
	Token   string `json:"token,omitempty"`
	FP      string `json:"fp,omitempty"`
	Resp    string `json:"resp,omitempty"`
	Lease   int64  `json:"lease,omitempty"`   // acquire, extend, claim: ns; 0 is an hour (saved histories)
	Name    string `json:"name,omitempty"`    // startstep, finishstep, resolvestep
	Result  string `json:"result,omitempty"`  // finishstep, resolvestep
	Nil     bool   `json:"nil,omitempty"`     // resolvestep: no result (the step did not happen)
	Payload string `json:"payload,omitempty"` // setrecovery
	Backoff int64  `json:"backoff,omitempty"` // claim: ns

	// Call and Ret are the call's times (operations sets them from its op).
	Call int64 `json:"-"`
	Ret  int64 `json:"-"`
}

// output is what the call returned.
type output struct {
	// Result: acquired, held, ok, notowner, found, notfound, entry,
	// journal, claimed, notclaimed, changed (ErrRecordChanged), or unknown
	// (the call failed: it may or may not have acted).
	Result string `json:"result"`
	// Rec: held, found; acquired: the previous holder of a lapsed lease
	// taken over (Token), when the store reported one.
	Rec   state  `json:"rec,omitzero"`
	Entry string `json:"entry,omitempty"` // entry: the step's entry; journal: the journal; claimed: payload and attempts
	Err   string `json:"err,omitempty"`
}

// state is the record of one key; State 0 is absent.
type state struct {
	State idem.State `json:"state,omitempty"`
	Token string     `json:"token,omitempty"`
	FP    string     `json:"fp,omitempty"`
	Resp  string     `json:"resp,omitempty"`

	// The model's own fields (zero in outputs).
	Journal   string `json:"-"` // entries "name/token" or "name/token=result", comma-separated
	Lapsed    bool   `json:"-"` // in progress, its lease lapsed, kept for its journal
	Suspended bool   `json:"-"` // made uncertain by Suspend
	Ghost     string `json:"-"` // absent: the token of a lapsed lease whose row may remain
	Short     string `json:"-"` // in progress: its lease is the millisecond its holder's shorten gave
	// Blocked, BlockedFP (claims): the token and fingerprint of a takeover
	// cut off after its claim, before its rewrite of the record: Acquire
	// and Claim answer from the claim (held by it) for the claim's lease
	// (an hour), while the record and every other call are as they were.
	Blocked, BlockedFP string `json:"-"`
	// Payload is the recovery payload ("": none), Attempts and Backoff
	// its claims' count and the last claim's backoff (ns); Kept: a step was
	// started or a payload set, so the record outlives its lease's lapse.
	Payload  string `json:"-"`
	Attempts int    `json:"-"`
	Backoff  int64  `json:"-"`
	Kept     bool   `json:"-"`
	KeepU    bool   `json:"-"` // Suspend gave it a keep: its lease's lapse makes it uncertain, never due
	// ClaimRet is the return time of the Acquire that took this record
	// over, ClaimFrom the lapsed holder whose journal it resumed ("": a
	// record without one): see claims in model.
	ClaimRet  int64  `json:"-"`
	ClaimFrom string `json:"-"`
}

// view is what a store returns about a record: a completed record's token
// may be dropped (idem.Record.Token).
func (s state) view() state {
	v := state{State: s.State, Token: s.Token, FP: s.FP, Resp: s.Resp}
	if s.State == idem.StateCompleted {
		v.Token = ""
	}
	return v
}

func (s state) String() string {
	var d string
	switch s.State {
	case 0:
		d = "absent"
		if s.Ghost != "" {
			d += " (row of " + s.Ghost + ")"
		}
	case idem.StateCompleted:
		d = fmt.Sprintf("completed(fp %s, %s)", s.FP, s.Resp)
	default:
		d = fmt.Sprintf("%v(%s, fp %s)", s.State, s.Token, s.FP)
	}
	if s.Lapsed {
		d += " lapsed"
	}
	if s.Journal != "" {
		d += " [" + s.Journal + "]"
	}
	if s.Payload != "" {
		d += fmt.Sprintf(" payload %s #%d", s.Payload, s.Attempts)
	}
	return d
}

// entries splits a journal.
func entries(journal string) []string {
	if journal == "" {
		return nil
	}
	return strings.Split(journal, ",")
}

// stepName is an entry's step name.
func stepName(entry string) string { name, _, _ := strings.Cut(entry, "/"); return name }

// reacquire is how a store answers Acquire by the token that holds the
// in-progress record (the engine's acquire sent again after a lost reply;
// tests/model documents each store's).
type reacquire string

const (
	reacquireNone    reacquire = "none"    // held, like any duplicate
	reacquireSame    reacquire = "same"    // with the same fingerprint while its lease is live: acquired, unchanged
	reacquireReplace reacquire = "replace" // acquired (its lease live or lapsed), written again with the call's fingerprint, its journal kept with the same one
)

// resume makes s, a new holder's record, go on with c's journal and
// recovery payload (a takeover with c's fingerprint, a claim).
func (s *state) resume(c state) {
	s.Journal, s.Payload, s.Attempts, s.Backoff, s.Kept = c.Journal, c.Payload, c.Attempts, c.Backoff, c.Kept
}

// phases are the records s may be during a call: s itself (no lease
// lapses but by a lapse call).
func phases(s state, _ input) []state { return []state{s} }

// apply is the call's effect on s in one phase: the outputs it may give
// (the first the main one) and the state after.
func apply(mode reacquire, s state, in input) ([]output, state) {
	switch {
	case s.Blocked != "" && in.Op == "acquire":
		return []output{{Result: "held", Rec: state{State: idem.StateInProgress, Token: s.Blocked, FP: s.BlockedFP}}}, s
	case s.Blocked != "" && in.Op == "claim":
		return []output{{Result: "notclaimed"}}, s
	}
	owner := (s.State == idem.StateInProgress && !s.Lapsed || s.State == idem.StateUncertain) && s.Token == in.Token
	leased := s.State == idem.StateInProgress && !s.Lapsed && s.Token == in.Token
	notowner := []output{{Result: "notowner"}}
	switch in.Op {
	case "acquire":
		fresh := state{State: idem.StateInProgress, Token: in.Token, FP: in.FP}
		switch {
		case s.State == 0:
			outs := []output{{Result: "acquired"}}
			if s.Ghost != "" {
				outs = append(outs, output{Result: "acquired", Rec: state{State: idem.StateInProgress, Token: s.Ghost}})
				fresh.ClaimRet = in.Ret
			}
			return outs, fresh
		case (s.State == idem.StateInProgress || s.State == idem.StateUncertain) && s.Token == in.Token && mode == reacquireReplace:
			// its own row, live, lapsed or uncertain: written again, the
			// journal kept with the fingerprint, no takeover reported
			if s.FP == in.FP {
				fresh.resume(s)
			}
			return []output{{Result: "acquired"}}, fresh
		case s.Lapsed && (s.FP == in.FP || s.Journal == ""): // a takeover: the journal and payload go on
			if s.FP == in.FP {
				fresh.resume(s)
			}
			fresh.ClaimRet, fresh.ClaimFrom = in.Ret, s.Token
			return []output{{Result: "acquired", Rec: state{State: idem.StateInProgress, Token: s.Token}}}, fresh
		case s.Lapsed:
		case s.State == idem.StateInProgress && !s.Lapsed && s.Token == in.Token && mode == reacquireSame && s.FP == in.FP:
			// its own lease, live: the acquire (or takeover script) sent again
			return []output{{Result: "acquired"}}, s
		}
		return []output{{Result: "held", Rec: s.view()}}, s
	case "complete":
		if !owner {
			return notowner, s
		}
		return []output{{Result: "ok"}}, state{State: idem.StateCompleted, Token: s.Token, FP: s.FP, Resp: in.Resp, Journal: s.Journal}
	case "release":
		if !owner {
			return notowner, s
		}
		return []output{{Result: "ok"}}, state{}
	case "extend":
		if !owner {
			return notowner, s
		}
		n := s
		n.State, n.Short = idem.StateInProgress, ""
		return []output{{Result: "ok"}}, n
	case "shorten": // the owner's Extend to a millisecond
		if !owner {
			return notowner, s
		}
		n := s
		n.State, n.Short = idem.StateInProgress, in.Token
		return []output{{Result: "ok"}}, n
	case "expire": // that millisecond's end, if it is the lease s holds
		if s.State != idem.StateInProgress || s.Lapsed || s.Short != in.Token || s.Token != in.Token {
			return []output{{Result: "ok"}}, s
		}
		n := s
		n.Short = ""
		switch {
		case s.KeepU:
			n.State = idem.StateUncertain
		case s.Kept:
			n.Lapsed = true
		default:
			n = state{Ghost: s.Token}
		}
		return []output{{Result: "ok"}}, n
	case "get":
		if s.State == 0 {
			return []output{{Result: "notfound"}}, s
		}
		return []output{{Result: "found", Rec: s.view()}}, s
	case "startstep":
		if !leased {
			return notowner, s
		}
		for _, e := range entries(s.Journal) {
			if stepName(e) == in.Name {
				return []output{{Result: "entry", Entry: e}}, s
			}
		}
		e := in.Name + "/" + in.Token
		n := s
		n.Journal, n.Kept = strings.Join(append(entries(s.Journal), e), ","), true
		return []output{{Result: "entry", Entry: e}}, n
	case "finishstep":
		if !leased {
			return notowner, s
		}
		es := entries(s.Journal)
		for k, e := range es {
			if stepName(e) != in.Name {
				continue
			}
			if !strings.Contains(e, "=") {
				es[k] = e + "=" + in.Result
			}
			n := s
			n.Journal = strings.Join(es, ",")
			return []output{{Result: "ok"}}, n
		}
		return notowner, s
	case "suspend":
		if !leased {
			return notowner, s
		}
		n := s
		n.State, n.Suspended, n.KeepU, n.Short = idem.StateUncertain, true, true, ""
		return []output{{Result: "ok"}}, n
	case "setrecovery":
		if !leased {
			return notowner, s
		}
		n := s
		n.Payload, n.Kept = in.Payload, true
		return []output{{Result: "ok"}}, n
	case "claim":
		if !s.Lapsed || s.Payload == "" || s.Attempts > 0 && s.Backoff > 0 { // backoffs are 0 or an hour
			return []output{{Result: "notclaimed"}}, s
		}
		n := state{State: idem.StateInProgress, Token: in.Token, FP: s.FP}
		n.resume(s)
		n.Attempts, n.Backoff, n.ClaimRet, n.ClaimFrom = s.Attempts+1, in.Backoff, in.Ret, s.Token
		return []output{{Result: "claimed", Rec: state{Token: s.Token, FP: s.FP}, Entry: fmt.Sprintf("%s #%d", s.Payload, n.Attempts)}}, n
	case "resolvestep":
		changed := []output{{Result: "changed"}}
		if s.State != idem.StateUncertain && !s.Lapsed {
			return changed, s
		}
		es := entries(s.Journal)
		k := slices.IndexFunc(es, func(e string) bool { return stepName(e) == in.Name })
		if k < 0 || strings.Contains(es[k], "=") {
			return changed, s
		}
		if in.Nil {
			es = slices.Delete(es, k, k+1)
		} else {
			es[k] += "=" + in.Result
		}
		n := s
		n.State, n.Lapsed, n.Journal, n.Suspended, n.KeepU = idem.StateInProgress, true, strings.Join(es, ","), true, false
		n.Attempts, n.Backoff = 0, 0
		return []output{{Result: "ok"}}, n
	case "steps":
		if s.State == 0 {
			return []output{{Result: "journal"}}, s
		}
		return []output{{Result: "journal", Entry: s.Journal}}, s
	}
	panic("unknown op " + in.Op)
}

// step is the model's Step: the states after a call answering out on s.
func step(mode reacquire, retries, claims, stale bool, s state, i input, got output) []state {
	got.Err = ""
	var nexts []state
	for _, s := range phases(s, i) {
		wants, next := apply(mode, s, i)
		if claims && i.Op == "get" && s.ClaimRet > i.Call {
			wants = append(wants, output{Result: "notfound"}) // the taken-over lapsed record, its journal empty
			if s.ClaimFrom != "" {
				wants = append(wants, output{Result: "found", Rec: state{State: idem.StateInProgress, Token: s.ClaimFrom, FP: s.FP}})
			}
		}
		ok := got.Result == "unknown" || slices.Contains(wants, got) ||
			i.Op == "acquire" && s.Lapsed && s.FP != i.FP && s.Journal == "" && got == (output{Result: "held", Rec: s.view()})
		if retries && !ok {
			switch {
			case got.Result == "notowner" && wants[0].Result == "ok" && (i.Op == "complete" || i.Op == "release" || i.Op == "suspend" || i.Op == "shorten"):
				ok = true // an attempt acted, its retry found it done
			case got == output{Result: "acquired"} && wants[0].Result == "acquired":
				ok = true // an attempt took over, its retry found its own record
			case got.Result == "notclaimed" && wants[0].Result == "claimed":
				ok = true // an attempt claimed, its retry found the lease live (not due): the record is the claimant's, its caller unaware
			}
		}
		if stale && !ok && i.Op == "acquire" && got.Result == "acquired" && got.Rec.Token != "" &&
			slices.ContainsFunc(wants, func(w output) bool { return w.Result == "acquired" && w.Rec.Token != "" }) {
			ok = true // a takeover reporting an earlier holder than the one it took over from (stale, see model)
		}
		if !ok {
			continue
		}
		alts := []state{next}
		if claims && got.Result == "unknown" && (wants[0].Result == "acquired" && (s.Lapsed || s.State == 0 && s.Ghost != "") || wants[0].Result == "claimed") {
			blocked := s // cut off after its claim (see Blocked)
			blocked.Blocked, blocked.BlockedFP = i.Token, i.FP
			if i.Op == "claim" {
				blocked.BlockedFP = s.FP
			}
			alts = append(alts, blocked)
		}
		if i.Op == "acquire" && s.Lapsed && s.FP != i.FP && s.Journal == "" && got == (output{Result: "held", Rec: s.view()}) {
			// no journal (a payload, or one ResolveStep emptied): taken over
			// by another fingerprint, or still refused to it (the contract
			// leaves it to the store: memstore refuses a payload record,
			// redisstore an emptied journal's)
			alts = []state{s}
		}
		if i.Op == "resolvestep" && got.Result == "ok" && (s.Attempts != 0 || s.Backoff != 0) {
			kept := next // the attempts counted from zero again, or kept (stores differ)
			kept.Attempts, kept.Backoff = s.Attempts, s.Backoff
			alts = append(alts, kept)
		}
		if next.State == idem.StateUncertain && next.Payload != "" && i.Op == "suspend" {
			dropped := next // the payload dropped as the record turns uncertain, or kept
			dropped.Payload, dropped.Attempts, dropped.Backoff = "", 0, 0
			alts = append(alts, dropped)
		}
		for _, n := range alts {
			if !slices.Contains(nexts, n) {
				nexts = append(nexts, n)
			}
		}
	}
	return nexts
}

// met files each call of a linearizable history by the record it met in
// porcupine's linearization (the model's states before it, in the phase
// of its call): in progress or uncertain (contended), among them a lapsed
// lease; completed.
func met(mode reacquire, retries, claims, stale bool, info porcupine.LinearizationInfo, counts *stats) {
	for _, lins := range info.PartialLinearizationsOperations() {
		if len(lins) == 0 {
			continue
		}
		states := []state{{}}
		for _, o := range lins[0] {
			in, out := o.Input.(input), o.Output.(output)
			contended, lapsed, completed := false, false, len(states) > 0
			for _, s := range states {
				for _, p := range phases(s, in) {
					contended = contended || p.State == idem.StateInProgress || p.State == idem.StateUncertain
					lapsed = lapsed || p.Lapsed || p.State == 0 && p.Ghost != ""
					completed = completed && p.State == idem.StateCompleted
				}
			}
			switch {
			case contended:
				counts.contended.Add(1)
			case completed:
				counts.completed.Add(1)
			}
			if lapsed {
				counts.lapsed.Add(1)
			}
			var next []state
			for _, s := range states {
				for _, n := range step(mode, retries, claims, stale, s, in, out) {
					if !slices.Contains(next, n) {
						next = append(next, n)
					}
				}
			}
			states = next
		}
	}
}

// model is the porcupine model of one record per key under mode. A call
// with an unknown outcome took effect at some point after its invocation,
// or never: porcupine may linearize it anywhere after its call (its return
// is the end of the history), where taking effect last is the same as
// never, so Step applies it and accepts it.
//
// claims: a takeover is two writes (mongostore: a claim, then the
// record rewritten), and Acquire answers from the claim while Get reads
// the record: until the taking Acquire returned, a Get may still find the
// lapsed record (not found without a journal; in progress under its
// previous holder with one); and a takeover (Acquire or Claim) whose
// outcome is unknown may have been cut off between the two, leaving its
// claim to answer Acquire and Claim for its lease while the record stays
// as it was (Blocked).
//
// stale: a takeover that raced another takeover and that holder's lapse
// may report, as the holder it took over from, the one before (pgstore at
// READ COMMITTED: the acquire statement reads the previous holder in its
// snapshot, and its ON CONFLICT update takes over the latest row version):
// the model then accepts any previous holder in a takeover's report, the
// takeover itself checked as always. A store bug, open (see
// tests/robustness/linear's package doc).
//
// retries: the store's client sends a command again after a lost reply
// (go-redis, MaxRetries), so a Complete, Release or Suspend whose first
// attempt acted answers ErrNotOwner from the second (a shorten's too, once
// its millisecond passed), and an Acquire whose
// first attempt took a lapsed lease over finds its own record (acquired,
// no takeover reported): the model then also accepts those answers, with
// the call's effect. The engine covers this for Complete
// (Execution.landed reads the record back) and takes ErrNotOwner from
// Release as done.
func model(mode reacquire, retries, claims, stale bool) porcupine.Model {
	m := &porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byKey := map[int][]porcupine.Operation{}
			for _, op := range history {
				k := op.Input.(input).Key
				byKey[k] = append(byKey[k], op)
			}
			keys := make([]int, 0, len(byKey))
			for k := range byKey {
				keys = append(keys, k)
			}
			sort.Ints(keys)
			out := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				out = append(out, byKey[k])
			}
			return out
		},
		Init: func() []any { return []any{state{}} },
		Step: func(st, in, out any) []any {
			var nexts []any
			for _, n := range step(mode, retries, claims, stale, st.(state), in.(input), out.(output)) {
				nexts = append(nexts, n)
			}
			return nexts
		},
		Equal: func(a, b any) bool { return a.(state) == b.(state) },
		DescribeOperation: func(in, out any) string {
			i, o := in.(input), out.(output)
			var call string
			switch i.Op {
			case "acquire":
				call = fmt.Sprintf("acquire(%s, fp %s, lease %v)", i.Token, i.FP, time.Duration(i.Lease))
			case "extend":
				call = fmt.Sprintf("extend(%s, lease %v)", i.Token, time.Duration(i.Lease))
			case "complete":
				call = fmt.Sprintf("complete(%s, %s)", i.Token, i.Resp)
			case "startstep":
				call = fmt.Sprintf("startstep(%s, %s)", i.Token, i.Name)
			case "finishstep":
				call = fmt.Sprintf("finishstep(%s, %s, %s)", i.Token, i.Name, i.Result)
			case "setrecovery":
				call = fmt.Sprintf("setrecovery(%s, %s)", i.Token, i.Payload)
			case "claim":
				call = fmt.Sprintf("claim(%s, lease %v, backoff %v)", i.Token, time.Duration(i.Lease), time.Duration(i.Backoff))
			case "resolvestep":
				call = fmt.Sprintf("resolvestep(%s, %q, nil %v)", i.Name, i.Result, i.Nil)
			case "get", "steps":
				call = i.Op + "()"
			default:
				call = fmt.Sprintf("%s(%s)", i.Op, i.Token)
			}
			res := o.Result
			switch {
			case o.Result == "held" || o.Result == "found":
				res += " " + o.Rec.String()
			case o.Result == "acquired" && o.Rec.Token != "":
				res += " over " + o.Rec.Token
			case o.Result == "claimed":
				res += fmt.Sprintf(" %s over %s (fp %s)", o.Entry, o.Rec.Token, o.Rec.FP)
			case o.Entry != "":
				res += " " + o.Entry
			case o.Err != "":
				res += " (" + o.Err + ")"
			}
			return fmt.Sprintf("k%d %s → %s", i.Key, call, res)
		},
		DescribeState: func(st any) string { return st.(state).String() },
	}
	return m.ToModel()
}
