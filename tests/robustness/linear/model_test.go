package linear

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	idem "github.com/idemkit/idem/core"
)

// The sequential model of one record. Retentions, a journal's retain and
// a suspended record's keep are an hour, far longer than a history, so no
// completed record expires and no uncertain one ends while a history is
// recorded; leases are an hour or short (lease), and the model follows a
// short one by time: each call carries its invocation and return times
// (those of its history, in nanoseconds since its start; an unknown
// outcome returns at the end), the record the window [lo, hi] in which
// its lease ends (the window of the Acquire or Extend that set it, plus
// the lease). A call over [call, ret] may find the lease live if call <
// hi + margin and lapsed if ret + margin > lo; where both hold the model
// follows both (porcupine's nondeterministic model), and once a branch
// finds it lapsed, it stays lapsed (linearization points follow real
// time). A lapsed record with a journal stays, in progress, its lease
// lapsed: taken over by the next Acquire with its fingerprint (reported
// with the previous token), refused to another, fenced against every
// holder; one without a journal is absent, its row perhaps still there
// (a takeover of it may be reported). Expiry of completed and uncertain
// records and Keep are time-dependent and checked deterministically
// elsewhere: tests/model runs every store against a model with explicit
// expiry windows (memstore on a fake clock).

// margin is the tolerance around a lease's end: the servers' clocks
// against the test's monotonic one (same machine), MongoDB's millisecond
// dates.
const margin = int64(50 * time.Millisecond)

// input is one call on a key.
type input struct {
	Op      string `json:"op"` // acquire, complete, release, extend, get, startstep, finishstep, suspend, steps
	Key     int    `json:"key"`
	Token   string `json:"token,omitempty"`
	FP      string `json:"fp,omitempty"`
	Resp    string `json:"resp,omitempty"`
	Lease   int64  `json:"lease,omitempty"`   // acquire, extend: ns; 0 is an hour
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
	Lo, Hi    int64  `json:"-"` // the window of the lease's end (in progress)
	Lapsed    bool   `json:"-"` // in progress, its lease lapsed, kept for its journal
	Suspended bool   `json:"-"` // made uncertain by Suspend
	Ghost     string `json:"-"` // absent: the token of a lapsed lease whose row may remain
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
	reacquireSame    reacquire = "same"    // with the same fingerprint: acquired, unchanged (not after a journal write or Suspend)
	reacquireReplace reacquire = "replace" // acquired (its lease live or lapsed), written again with the call's fingerprint, its journal kept with the same one
)

// resume makes s, a new holder's record, go on with c's journal and
// recovery payload (a takeover with c's fingerprint, a claim).
func (s *state) resume(c state) {
	s.Journal, s.Payload, s.Attempts, s.Backoff, s.Kept = c.Journal, c.Payload, c.Attempts, c.Backoff, c.Kept
}

// leaseEnd is the window of the end of a lease given over [call, ret].
func leaseEnd(in input) (lo, hi int64) {
	if in.Lease == 0 {
		return math.MaxInt64 / 4, math.MaxInt64 / 4
	}
	return in.Call + in.Lease, in.Ret + in.Lease
}

// phases are the records s may be during a call over [call, ret]: its
// lease live, lapsed, or either.
func phases(s state, in input) []state {
	if s.State != idem.StateInProgress || s.Lapsed {
		return []state{s}
	}
	var out []state
	if in.Call < s.Hi+margin {
		out = append(out, s)
	}
	if in.Ret+margin > s.Lo {
		lapsed := s
		lapsed.Lapsed = true
		switch {
		case s.KeepU: // kept uncertain, as Suspend left it
			lapsed.State, lapsed.Lapsed = idem.StateUncertain, false
		case !s.Kept:
			lapsed = state{Ghost: s.Token}
		}
		out = append(out, lapsed)
	}
	return out
}

// apply is the call's effect on s in one phase: the outputs it may give
// (the first the main one) and the state after.
func apply(mode reacquire, s state, in input) ([]output, state) {
	owner := (s.State == idem.StateInProgress && !s.Lapsed || s.State == idem.StateUncertain) && s.Token == in.Token
	leased := s.State == idem.StateInProgress && !s.Lapsed && s.Token == in.Token
	notowner := []output{{Result: "notowner"}}
	switch in.Op {
	case "acquire":
		fresh := state{State: idem.StateInProgress, Token: in.Token, FP: in.FP}
		fresh.Lo, fresh.Hi = leaseEnd(in)
		live := s.State == idem.StateInProgress && !s.Lapsed || s.State == idem.StateUncertain
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
		case live && s.Token == in.Token && mode == reacquireSame && s.FP == in.FP && s.Journal == "" && s.Payload == "" && !s.Suspended:
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
		n.State = idem.StateInProgress
		n.Lo, n.Hi = leaseEnd(in)
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
		n.State, n.Suspended, n.KeepU, n.Lo, n.Hi = idem.StateUncertain, true, true, 0, 0
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
		n.Lo, n.Hi = leaseEnd(in)
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
		n.Attempts, n.Backoff, n.Lo, n.Hi = 0, 0, in.Call, in.Ret
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
func step(mode reacquire, retries, claims bool, s state, i input, got output) []state {
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
			case got.Result == "notowner" && wants[0].Result == "ok" && (i.Op == "complete" || i.Op == "release" || i.Op == "suspend"):
				ok = true // an attempt acted, its retry found it done
			case got == output{Result: "acquired"} && wants[0].Result == "acquired":
				ok = true // an attempt took over, its retry found its own record
			}
		}
		if !ok {
			continue
		}
		alts := []state{next}
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
func met(mode reacquire, retries, claims bool, info porcupine.LinearizationInfo, counts *stats) {
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
				for _, n := range step(mode, retries, claims, s, in, out) {
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
// previous holder with one).
//
// retries: the store's client sends a command again after a lost reply
// (go-redis, MaxRetries), so a Complete, Release or Suspend whose first
// attempt acted answers ErrNotOwner from the second, and an Acquire whose
// first attempt took a lapsed lease over finds its own record (acquired,
// no takeover reported): the model then also accepts those answers, with
// the call's effect. The engine covers this for Complete
// (Execution.landed reads the record back) and takes ErrNotOwner from
// Release as done.
func model(mode reacquire, retries, claims bool) porcupine.Model {
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
			for _, n := range step(mode, retries, claims, st.(state), in.(input), out.(output)) {
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
