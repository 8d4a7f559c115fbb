package linear

import (
	"fmt"
	"sort"

	"github.com/anishathalye/porcupine"

	idem "github.com/idemkit/idem/core"
)

// The sequential model of one record, without time: every lease and
// retention in the histories is an hour, far longer than a test, so no
// record expires or turns uncertain while a history is recorded, and the
// record's state is a function of the operations alone. Expiry, the
// uncertain state and tombstones are time-dependent and are checked
// deterministically elsewhere: tests/model runs every store against a
// model with explicit expiry windows (memstore on a fake clock).

// input is one call on a key.
type input struct {
	Op    string `json:"op"` // acquire, complete, release, extend, get
	Key   int    `json:"key"`
	Token string `json:"token,omitempty"`
	FP    string `json:"fp,omitempty"`
	Resp  string `json:"resp,omitempty"`
}

// output is what the call returned.
type output struct {
	// Result: acquired, held, ok, notowner, found, notfound, or unknown
	// (the call failed: it may or may not have acted).
	Result string `json:"result"`
	Rec    state  `json:"rec,omitzero"` // held, found
	Err    string `json:"err,omitempty"`
}

// state is the record of one key; State 0 is absent.
type state struct {
	State idem.State `json:"state,omitempty"`
	Token string     `json:"token,omitempty"`
	FP    string     `json:"fp,omitempty"`
	Resp  string     `json:"resp,omitempty"`
}

// view is what a store returns about a record: a completed record's token
// may be dropped (idem.Record.Token).
func (s state) view() state {
	if s.State == idem.StateCompleted {
		s.Token = ""
	}
	return s
}

func (s state) String() string {
	switch s.State {
	case 0:
		return "absent"
	case idem.StateCompleted:
		return fmt.Sprintf("completed(fp %s, %s)", s.FP, s.Resp)
	}
	return fmt.Sprintf("%v(%s, fp %s)", s.State, s.Token, s.FP)
}

// reacquire is how a store answers Acquire by the token that holds the
// in-progress record (the engine's acquire sent again after a lost reply;
// tests/model documents each store's).
type reacquire string

const (
	reacquireNone    reacquire = "none"    // held, like any duplicate
	reacquireSame    reacquire = "same"    // with the same fingerprint: acquired, unchanged
	reacquireReplace reacquire = "replace" // acquired, written again with the call's fingerprint
)

// apply is the call's effect on s: its expected output and the state after.
func apply(mode reacquire, s state, in input) (output, state) {
	owner := s.State == idem.StateInProgress && s.Token == in.Token
	switch in.Op {
	case "acquire":
		fresh := state{State: idem.StateInProgress, Token: in.Token, FP: in.FP}
		switch {
		case s.State == 0:
			return output{Result: "acquired"}, fresh
		case owner && mode == reacquireSame && s.FP == in.FP:
			return output{Result: "acquired"}, s
		case owner && mode == reacquireReplace:
			return output{Result: "acquired"}, fresh
		}
		return output{Result: "held", Rec: s.view()}, s
	case "complete":
		if !owner {
			return output{Result: "notowner"}, s
		}
		return output{Result: "ok"}, state{State: idem.StateCompleted, Token: s.Token, FP: s.FP, Resp: in.Resp}
	case "release":
		if !owner {
			return output{Result: "notowner"}, s
		}
		return output{Result: "ok"}, state{}
	case "extend":
		if !owner {
			return output{Result: "notowner"}, s
		}
		return output{Result: "ok"}, s
	case "get":
		if s.State == 0 {
			return output{Result: "notfound"}, s
		}
		return output{Result: "found", Rec: s.view()}, s
	}
	panic("unknown op " + in.Op)
}

// model is the porcupine model of one record per key under mode. A call
// with an unknown outcome took effect at some point after its invocation,
// or never: porcupine may linearize it anywhere after its call (its return
// is the end of the history), where taking effect last is the same as
// never, so Step applies it and accepts it.
//
// retries: the store's client sends a command again after a lost reply
// (go-redis, MaxRetries), so a Complete or Release whose first attempt
// acted answers ErrNotOwner from the second: the model then also accepts
// "notowner" from the owner, with the call's effect. The engine covers
// this for Complete (Execution.landed reads the record back) and takes
// ErrNotOwner from Release as done.
func model(mode reacquire, retries bool) porcupine.Model {
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
			s, i := st.(state), in.(input)
			want, next := apply(mode, s, i)
			got := out.(output)
			got.Err = ""
			switch {
			case got.Result == "unknown", got == want:
				return []any{next}
			case retries && got.Result == "notowner" && want.Result == "ok" && (i.Op == "complete" || i.Op == "release"):
				return []any{next} // an attempt acted, its retry found it done
			}
			return nil
		},
		Equal: func(a, b any) bool { return a.(state) == b.(state) },
		DescribeOperation: func(in, out any) string {
			i, o := in.(input), out.(output)
			var call string
			switch i.Op {
			case "acquire":
				call = fmt.Sprintf("acquire(%s, fp %s)", i.Token, i.FP)
			case "complete":
				call = fmt.Sprintf("complete(%s, %s)", i.Token, i.Resp)
			case "get":
				call = "get()"
			default:
				call = fmt.Sprintf("%s(%s)", i.Op, i.Token)
			}
			res := o.Result
			switch {
			case o.Result == "held" || o.Result == "found":
				res += " " + o.Rec.String()
			case o.Err != "":
				res += " (" + o.Err + ")"
			}
			return fmt.Sprintf("k%d %s → %s", i.Key, call, res)
		},
		DescribeState: func(st any) string { return st.(state).String() },
	}
	return m.ToModel()
}
