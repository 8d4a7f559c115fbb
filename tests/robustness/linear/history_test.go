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
	Retries bool      `json:"retries"` // the model accepts a retried Complete or Release answering ErrNotOwner
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
		out[i] = porcupine.Operation{ClientId: o.Client, Input: o.In, Call: o.Call, Output: o.Out, Return: o.Return}
	}
	return out
}

// recorder collects the operations of concurrent clients.
type recorder struct {
	start time.Time
	keys  []string
	mu    sync.Mutex
	ops   []op
}

func newRecorder(nkeys int) *recorder {
	r := &recorder{start: time.Now()}
	for range nkeys {
		r.keys = append(r.keys, storetest.Key())
	}
	return r
}

// call runs one operation on s with a per-call timeout and records it. A
// system error (anything but a decision: ErrNotOwner) makes the outcome
// unknown: the call may have acted.
func (r *recorder) call(s idem.Store, client int, in input, timeout time.Duration) output {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	key := r.keys[in.Key]
	call := time.Since(r.start).Nanoseconds()
	var out output
	var err error
	switch in.Op {
	case "acquire":
		var rec idem.Record
		var acquired bool
		rec, acquired, err = s.Acquire(ctx, key, in.Token, in.FP, hour)
		if acquired {
			out.Result = "acquired"
		} else {
			out = output{Result: "held", Rec: fromRecord(rec).view()}
		}
	case "complete":
		err = s.Complete(ctx, key, in.Token, []byte(in.Resp), hour)
		out.Result = "ok"
	case "release":
		err = s.Release(ctx, key, in.Token)
		out.Result = "ok"
	case "extend":
		err = s.(idem.Extender).Extend(ctx, key, in.Token, hour)
		out.Result = "ok"
	case "get":
		var rec idem.Record
		var found bool
		rec, found, err = s.Get(ctx, key)
		out = output{Result: "notfound"}
		if found {
			out = output{Result: "found", Rec: fromRecord(rec).view()}
		}
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
	return out
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

// client runs random calls on s until stop. Like an engine, it acquires a
// key with a fresh token, then completes, releases or extends it with
// that token (sometimes it acquires it again with the same token and
// fingerprint, as an engine's acquire sent again after a lost reply);
// others read it; a few calls use a token that owns nothing.
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
		key := rng.IntN(len(r.keys))
		in := input{Key: key}
		a, holds := held[key]
		switch p := rng.IntN(100); {
		case p < 30:
			if holds && rng.IntN(3) == 0 {
				in = a // sent again
				break
			}
			n++
			in.Op, in.Token, in.FP = "acquire", fmt.Sprintf("c%d-%d", id, n), fingerprints[rng.IntN(len(fingerprints))]
		case p < 42:
			in.Op, in.Token, in.Resp = "complete", a.Token, fmt.Sprintf("r%d-%d", id, rng.IntN(1000))
		case p < 62:
			in.Op, in.Token = "release", a.Token
		case p < 70:
			in.Op, in.Token = "extend", a.Token
		default:
			in.Op = "get"
		}
		if in.Op != "get" && in.Op != "acquire" && (!holds || rng.IntN(10) == 0) {
			in.Token = fmt.Sprintf("c%d-stale", id)
		}
		out := r.call(s, id, in, timeout)
		counts.ops.Add(1)
		if out.Result == "unknown" {
			counts.unknown.Add(1)
			// back off, as a client would: every unknown call stays open
			// to the end of the history, and porcupine's search grows
			// with them
			time.Sleep(30 * time.Millisecond)
		}
		switch {
		case in.Op == "acquire" && (out.Result == "acquired" || out.Result == "unknown"):
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
}

// check judges a history with porcupine and, when it is not linearizable,
// saves it (JSON and HTML) under testdata/found and fails the test.
func check(t *testing.T, h recorded, counts *stats) {
	t.Helper()
	m := model(h.Mode, h.Retries)
	res, info := porcupine.CheckOperationsVerbose(m, operations(h.Ops), 30*time.Second)
	counts.histories.Add(1)
	h.Verdict = string(res)
	if res == porcupine.Ok && *saveAll {
		save(t, m, h, info)
	}
	switch res {
	case porcupine.Ok:
		return
	case porcupine.Unknown:
		counts.undecided.Add(1)
		t.Logf("%s: porcupine did not decide a history of %d operations within 30s", h.Store, len(h.Ops))
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
