package linear

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
)

// hour is every lease and retention of the histories: nothing expires
// while one is recorded (model_test.go).
const hour = time.Hour

var fingerprints = []string{"fp1", "fp2"}

// recorded is one history: its store, the store's reacquire mode and its
// operations, as saved in testdata (JSON).
type recorded struct {
	Store   string    `json:"store"`
	Mode    reacquire `json:"mode"`
	Retries bool      `json:"retries"`          // the model accepts a retried Complete or Release answering ErrNotOwner
	Claims  bool      `json:"claims,omitempty"` // a takeover in flight is visible to Acquire before Get (see model)
	Stale   bool      `json:"stale,omitempty"`  // a takeover may report an earlier holder (see model)
	Seed    uint64    `json:"seed"`
	Verdict string    `json:"verdict"` // porcupine's: Ok, Illegal
	Ops     []op      `json:"ops"`
}

// op is one call of a history; times are nanoseconds since its start.
type op struct {
	Client int    `json:"client"`
	In     input  `json:"in"`
	Out    output `json:"out"`
	Call   int64  `json:"call"`
	Return int64  `json:"return"`
}

// operations converts ops for porcupine.
func operations(ops []op) []porcupine.Operation {
	out := make([]porcupine.Operation, len(ops))
	for i, o := range ops {
		in := o.In
		in.Call, in.Ret = o.Call, o.Return
		out[i] = porcupine.Operation{ClientId: o.Client, Input: in, Call: o.Call, Output: o.Out, Return: o.Return}
	}
	return out
}

// recorder collects the operations of concurrent clients on keys made as
// they are needed (slots).
type recorder struct {
	start time.Time
	mu    sync.Mutex
	keys  []string
	ops   []op
	// slots: the key each of the few slots the clients work on holds now;
	// a client that finds a slot's record completed moves the slot to a new
	// key, so that most calls meet records in progress, not completed ones.
	slots []int
}

func newRecorder(nslots int) *recorder {
	r := &recorder{start: time.Now()}
	for range nslots {
		r.slots = append(r.slots, len(r.keys))
		r.keys = append(r.keys, storetest.Key())
	}
	return r
}

// slot returns the key slot i holds now.
func (r *recorder) slot(i int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.slots[i]
}

// retire moves every slot holding key to a new key.
func (r *recorder) retire(key int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, k := range r.slots {
		if k == key {
			r.slots[i] = len(r.keys)
			r.keys = append(r.keys, storetest.Key())
		}
	}
}

func (r *recorder) key(i int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.keys) <= i { // a replayed history's keys
		r.keys = append(r.keys, storetest.Key())
	}
	return r.keys[i]
}

// leaseOf is a call's lease: in.Lease, or an hour.
func leaseOf(in input) time.Duration {
	if in.Lease == 0 {
		return hour
	}
	return time.Duration(in.Lease)
}

// call runs one operation on s with a per-call timeout and records it. A
// system error (anything but a decision: ErrNotOwner) makes the outcome
// unknown: the call may have acted.
func (r *recorder) call(s idem.Store, client int, in input, timeout time.Duration) output {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	key := r.key(in.Key)
	call := time.Since(r.start).Nanoseconds()
	var out output
	var err error
	switch in.Op {
	case "acquire":
		var rec idem.Record
		var acquired bool
		rec, acquired, err = s.Acquire(ctx, key, in.Token, in.FP, leaseOf(in))
		switch {
		case acquired && rec.Token != "":
			out = output{Result: "acquired", Rec: state{State: rec.State, Token: rec.Token}}
			if rec.LeaseLeft >= 0 {
				out.Err = fmt.Sprintf("takeover with LeaseLeft %v", rec.LeaseLeft) // fails the check
			}
		case acquired:
			out.Result = "acquired"
		default:
			out = output{Result: "held", Rec: fromRecord(rec).view()}
		}
	case "complete":
		err = s.Complete(ctx, key, in.Token, []byte(in.Resp), hour)
		out.Result = "ok"
	case "release":
		err = s.Release(ctx, key, in.Token)
		out.Result = "ok"
	case "extend":
		err = s.(idem.Extender).Extend(ctx, key, in.Token, leaseOf(in))
		out.Result = "ok"
	case "shorten": // a lapse: the holder's lease ends within a millisecond (see expire below)
		err = s.(idem.Extender).Extend(ctx, key, in.Token, time.Millisecond)
		out.Result = "ok"
	case "expire": // recorded with its shorten (a replayed one changes nothing)
		out.Result = "ok"
	case "get":
		var rec idem.Record
		var found bool
		rec, found, err = s.Get(ctx, key)
		out = output{Result: "notfound"}
		if found {
			out = output{Result: "found", Rec: fromRecord(rec).view()}
		}
	case "startstep":
		var e idem.StepEntry
		e, err = s.(idem.Journal).StartStep(ctx, key, in.Token, in.Name, hour)
		out = output{Result: "entry", Entry: entryOf(e)}
	case "finishstep":
		err = s.(idem.Journal).FinishStep(ctx, key, in.Token, in.Name, []byte(in.Result))
		out.Result = "ok"
	case "suspend":
		err = s.(idem.Journal).Suspend(ctx, key, in.Token, hour)
		out.Result = "ok"
	case "setrecovery":
		err = s.(idem.Recoverable).SetRecovery(ctx, key, in.Token, []byte(in.Payload), hour, leaseOf(in))
		out.Result = "ok"
	case "claim":
		var c idem.RecoveryClaim
		var claimed bool
		c, claimed, err = s.(idem.Recoverable).Claim(ctx, key, in.Token, leaseOf(in), time.Duration(in.Backoff))
		out.Result = "notclaimed"
		if claimed {
			out = output{Result: "claimed", Rec: state{Token: c.PreviousToken, FP: c.Fingerprint}, Entry: fmt.Sprintf("%s #%d", c.Payload, c.Attempts)}
			if c.Lapsed <= 0 {
				out.Err = fmt.Sprintf("claim with Lapsed %v", c.Lapsed) // fails the check
			}
		}
	case "resolvestep":
		var result []byte
		if !in.Nil {
			result = []byte(in.Result)
		}
		err = s.(idem.StepResolver).ResolveStep(ctx, key, in.Name, result)
		out.Result = "ok"
		if errors.Is(err, idem.ErrRecordChanged) {
			out, err = output{Result: "changed"}, nil
		}
	case "steps":
		var steps []idem.StepEntry
		steps, err = s.(idem.Journal).Steps(ctx, key)
		es := make([]string, len(steps))
		for i, e := range steps {
			es[i] = entryOf(e)
		}
		out = output{Result: "journal", Entry: strings.Join(es, ",")}
	}
	ret := time.Since(r.start).Nanoseconds()
	switch {
	case errors.Is(err, idem.ErrNotOwner):
		out = output{Result: "notowner"}
	case err != nil:
		out = output{Result: "unknown", Err: shortErr(err)}
		ret = -1 // set past the end of the history
	}
	r.mu.Lock()
	r.ops = append(r.ops, op{Client: client, In: in, Out: out, Call: call, Return: ret})
	r.mu.Unlock()
	if in.Op == "shorten" {
		// the lease's end: after the shorten took effect, before the wait
		// past its return ended (unknown: at any time after its call)
		time.Sleep(lapseWait)
		end := time.Since(r.start).Nanoseconds()
		if ret < 0 {
			end = -1
		}
		r.mu.Lock()
		r.ops = append(r.ops, op{Client: client, In: input{Op: "expire", Key: in.Key, Token: in.Token}, Out: output{Result: "ok"}, Call: call, Return: end})
		r.mu.Unlock()
	}
	return out
}

// entryOf is a journal entry as the model writes it.
func entryOf(e idem.StepEntry) string {
	s := e.Name + "/" + e.Token
	if e.Done {
		s += "=" + string(e.Result)
	}
	return s
}

func shortErr(err error) string {
	s := err.Error()
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return s
}

func fromRecord(r idem.Record) state {
	return state{State: r.State, Token: r.Token, FP: r.Fingerprint, Resp: string(r.Response)}
}

// history returns the operations, unknown ones returning after every
// other: they may take effect at any point after their call.
func (r *recorder) history() []op {
	r.mu.Lock()
	defer r.mu.Unlock()
	end := int64(0)
	for _, o := range r.ops {
		end = max(end, o.Return, o.Call)
	}
	ops := slices.Clone(r.ops)
	for i := range ops {
		if ops[i].Return < 0 {
			ops[i].Return = end + 1
		}
	}
	return ops
}

// lapseWait is how long a lapse call waits after its Extend to a
// millisecond returned: past that millisecond on the store's clock, which
// is the machine's (Redis, PostgreSQL, MySQL) or the local one shifted by
// a constant (mongostore, its clock offset measured once).
const lapseWait = 5 * time.Millisecond

// stepNames are the steps clients journal.
var stepNames = []string{"charge", "email"}

// client runs random calls on s until stop. Like an engine, it acquires a
// key with a fresh token (for an hour), or claims it as a
// recoverer would, journals steps (start, finish, sometimes suspend),
// sets a recovery payload, renews, lets its lease lapse (a lapse call:
// a crash or a stall), completes or releases it with that token, and keeps using the token after its lease lapsed and
// another took the record over (a former holder, fenced off); sometimes it
// acquires it again with the same token and fingerprint, as an engine's
// acquire sent again after a lost reply; others read the record and its
// journal, or resolve a step as an operator would; a few calls use a
// token that owns nothing. Calls go to the
// recorder's slots, few, and a slot whose record is completed moves to a
// new key.
func client(s idem.Store, r *recorder, id int, seed uint64, stop <-chan struct{}, timeout time.Duration, counts *stats) {
	rng := rand.New(rand.NewPCG(seed, uint64(id)))
	held := map[int]input{} // key → the acquire this client may hold it by
	n := 0
	for {
		select {
		case <-stop:
			return
		default:
		}
		key := r.slot(rng.IntN(len(r.slots)))
		in := input{Key: key}
		a, holds := held[key]
		lease := int64(0) // an hour: leases end by lapse calls only
		switch p := rng.IntN(100); {
		case p < 22:
			if holds && rng.IntN(3) == 0 {
				in = a // sent again
				break
			}
			n++
			in.Op, in.Token, in.FP, in.Lease = "acquire", fmt.Sprintf("c%d-%d", id, n), fingerprints[rng.IntN(len(fingerprints))], lease
		case p < 28:
			in.Op, in.Token, in.Resp = "complete", a.Token, fmt.Sprintf("r%d-%d", id, rng.IntN(1000))
		case p < 34:
			in.Op, in.Token = "release", a.Token
		case p < 38:
			in.Op, in.Token, in.Lease = "extend", a.Token, lease
		case p < 44:
			in.Op, in.Token = "shorten", a.Token
		case p < 58:
			in.Op, in.Token, in.Name = "startstep", a.Token, stepNames[rng.IntN(len(stepNames))]
		case p < 66:
			in.Op, in.Token, in.Name, in.Result = "finishstep", a.Token, stepNames[rng.IntN(len(stepNames))], fmt.Sprintf("v%d", rng.IntN(100))
		case p < 68:
			in.Op, in.Token = "suspend", a.Token
		case p < 72:
			in.Op, in.Token, in.Payload, in.Lease = "setrecovery", a.Token, fmt.Sprintf("p%d-%d", id, rng.IntN(100)), lease
		case p < 78:
			if holds && a.Op == "claim" && rng.IntN(3) == 0 {
				in = a // sent again
				break
			}
			n++
			in.Op, in.Token, in.Lease = "claim", fmt.Sprintf("c%d-%d", id, n), lease
			if rng.IntN(4) == 0 {
				in.Backoff = int64(hour)
			}
		case p < 81:
			in.Op, in.Name = "resolvestep", stepNames[rng.IntN(len(stepNames))]
			in.Result, in.Nil = fmt.Sprintf("v%d", rng.IntN(100)), rng.IntN(2) == 0
		case p < 86:
			in.Op = "steps"
		default:
			in.Op = "get"
		}
		if in.Op != "get" && in.Op != "steps" && in.Op != "acquire" && in.Op != "claim" && in.Op != "resolvestep" && (!holds || rng.IntN(10) == 0) {
			in.Token = fmt.Sprintf("c%d-stale", id)
		}
		out := r.call(s, id, in, timeout)
		counts.ops.Add(1)
		if out.Result == "acquired" && out.Rec.Token != "" {
			counts.takeovers.Add(1)
		}
		if out.Result == "claimed" {
			counts.claims.Add(1)
		}
		if out.Result == "notowner" && holds && in.Token == a.Token {
			counts.fenced.Add(1)
		}
		if out.Result == "unknown" {
			counts.unknown.Add(1)
			// back off, as a client would: every unknown call stays open
			// to the end of the history, and porcupine's search grows
			// with them
			time.Sleep(30 * time.Millisecond)
		}
		if (out.Result == "held" || out.Result == "found") && out.Rec.State == idem.StateCompleted {
			r.retire(key)
		}
		switch {
		case in.Op == "acquire" && (out.Result == "acquired" || out.Result == "unknown"),
			in.Op == "claim" && (out.Result == "claimed" || out.Result == "unknown"):
			held[key] = in
		case in.Op == "acquire", in.Op == "complete" && out.Result != "unknown", in.Op == "release" && out.Result != "unknown":
			if in.Token == a.Token {
				delete(held, key)
			}
		}
	}
}

// stats are the figures of a run, per store.
type stats struct {
	histories, ops, unknown, faults, restarts, anomalies, undecided atomic.Int64
	// contended: calls of linearizable histories that met a record in
	// progress (its lease live or lapsed) or uncertain in porcupine's
	// linearization; lapsed: calls that met a lapsed lease; completed:
	// calls that met a completed record; takeovers: acquires of a lapsed
	// lease, reported with its holder; fenced: calls refused to a token
	// its client acquired the key with (lapsed, taken over, or ended).
	// claims: recoverers' Claims that took a lapsed record over.
	contended, lapsed, completed, takeovers, fenced, claims atomic.Int64
}

// checkTimeout bounds porcupine's search for one history: a history it
// does not decide in time (many calls of unknown outcome near short
// leases' ends, MariaDB under timeouts) is counted undecided, not failed.
const checkTimeout = 10 * time.Second

// check judges a history with porcupine and, when it is not linearizable,
// saves it (JSON and HTML) under testdata/found and fails the test.
func check(t *testing.T, h recorded, counts *stats) {
	t.Helper()
	m := model(h.Mode, h.Retries, h.Claims, h.Stale)
	res, info := porcupine.CheckOperationsVerbose(m, operations(h.Ops), checkTimeout)
	counts.histories.Add(1)
	h.Verdict = string(res)
	if res == porcupine.Ok && *saveAll {
		save(t, m, h, info)
	}
	switch res {
	case porcupine.Ok:
		met(h.Mode, h.Retries, h.Claims, h.Stale, info, counts)
		return
	case porcupine.Unknown:
		counts.undecided.Add(1)
		t.Logf("%s: porcupine did not decide a history of %d operations within %v", h.Store, len(h.Ops), checkTimeout)
		return
	}
	counts.anomalies.Add(1)
	name := save(t, m, h, info)
	t.Errorf("%s: history of %d operations (seed %d) is not linearizable: %s.json and .html", h.Store, len(h.Ops), h.Seed, name)
}

// save writes h as JSON and porcupine's visualisation as HTML under
// testdata/found, and returns their path without extension.
func save(t *testing.T, m porcupine.Model, h recorded, info porcupine.LinearizationInfo) string {
	t.Helper()
	dir := filepath.Join("testdata", "found")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, fmt.Sprintf("%s-%d", strings.ReplaceAll(h.Store, "/", "-"), h.Seed))
	b, err := json.MarshalIndent(h, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name+".json", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := porcupine.VisualizePath(m, info, name+".html"); err != nil {
		t.Errorf("visualize: %v", err)
	}
	return name
}
