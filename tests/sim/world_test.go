package sim

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

// Virtual timeline of one run (synctest's clock starts at 2000-01-01).
const (
	lease        = 4 * time.Second
	storeTimeout = time.Second
	chaos        = 40 * time.Second  // faults, crashes and stalls happen before this
	clientsStop  = 70 * time.Second  // clients stop retrying
	operatorStop = 100 * time.Second // the operator stops resolving
	horizon      = 180 * time.Second // recoverers run until this; then the checks
	opName       = "pay"
)

// params are what a seed chooses about its run.
type params struct {
	instances, keys, clients int
	reuse                    float64 // chance a client uses the key with another payload
	storeFault               int     // per 10,000 store calls, for each kind of store fault
	yieldCrash, yieldStall   int     // per 10,000 handler points
	instFaults               int     // instance crashes/stalls/restarts scheduled
	operator                 bool
	http                     []bool // by key: its clients go through the HTTP middleware (idemhttp), else idem.Do
}

func paramsFor(seed uint64) params {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	p := params{
		instances:  2 + r.IntN(2),
		keys:       1 + r.IntN(3),
		clients:    2 + r.IntN(5),
		storeFault: []int{0, 50, 150, 400}[r.IntN(4)],
		yieldCrash: []int{0, 200, 600}[r.IntN(3)],
		yieldStall: []int{0, 200, 600}[r.IntN(3)],
		instFaults: r.IntN(4),
		operator:   r.IntN(3) > 0,
	}
	if r.IntN(3) == 0 {
		p.reuse = 0.3
	}
	for range p.keys {
		p.http = append(p.http, r.IntN(2) == 0)
	}
	return p
}

// world is one simulated run: a memstore shared by the instances'
// engines, their recoverers, the clients, an operator and the fault
// scheduler, all in one synctest bubble.
type world struct {
	seed uint64
	p    params
	mem  *memstore.Store
	log  *slog.Logger
	ctx  context.Context // values only; never cancelled

	mu         sync.Mutex // one atomic step of the simulation: a store call and what the world learns from it
	shadow     map[string]*shadowRec
	keys       []string // scoped keys, by index
	keyIdx     map[string]int
	effects    []effect
	violations []string
	counts     map[string]int
	trace      uint64 // the sum of the store calls' hashes (time, call, key, outcome), for replay checks
	ops        int
	insts      []*instance
	tokens     map[string]*run // by lease token (set by StartStep)
	started    []*instance     // every instance the run started, dead ones included
	clients    []*client

	verbose bool     // keep lines: the store calls applied and the faults (-sim.trace)
	lines   []string // under mu

	faults atomic.Bool
	end    chan struct{} // closed when the run ends: blocked (crashed) handlers return
	wg     sync.WaitGroup
}

// shadowRec is what the simulation knows of a key's record from the
// store calls that succeeded: who holds it and until when.
type shadowRec struct {
	holder      string // the token whose acquire or claim came last; "" after a completion, release or resolve
	leaseEnd    time.Time
	suspended   bool          // its holder suspended it (uncertain): its own token may still complete, release or extend
	completed   []byte        // the first completed answer seen
	incarnation int           // bumped when the record is created anew (its journal starts empty)
	released    bool          // released (or resolved with nil) and not acquired since: the key is free
	claimLease  time.Duration // the lease the last SetRecovery kept with the payload: a claim's
}

// effect is one run of a step's function reaching its side effect.
type effect struct {
	key         int
	step        string
	token       string
	incarnation int // of the record when the step was started
	repeatable  bool
	fenced      bool // its token no longer held the key when the effect happened (a stalled holder)
	at          time.Duration
	value       string
}

func newWorld(seed uint64) *world {
	w := &world{seed: seed, p: paramsFor(seed), shadow: map[string]*shadowRec{}, keyIdx: map[string]int{},
		counts: map[string]int{}, tokens: map[string]*run{}, end: make(chan struct{}),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), ctx: context.Background()}
	w.mem = memstore.New(memstore.WithCleanupInterval(0))
	for i := range w.p.keys {
		k := idem.ScopedKey("", "(do)", opName, fmt.Sprintf("k%d", i))
		if w.p.http[i] {
			k = idem.ScopedKey(principal, http.MethodPost, "/pay", fmt.Sprintf("k%d", i))
		}
		w.keys = append(w.keys, k)
		w.keyIdx[k] = i
	}
	w.faults.Store(true)
	return w
}

// since returns the virtual time since the run began.
var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func since() time.Duration { return time.Since(epoch) }

// roll returns a number in [0, n) decided by the seed and parts alone, so
// that a decision does not depend on which goroutine asks first.
func (w *world) roll(n int, parts ...string) int {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], w.seed)
	h.Write(b[:])
	binary.LittleEndian.PutUint64(b[:], uint64(time.Now().UnixNano()))
	h.Write(b[:])
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	x := h.Sum64()
	x ^= x >> 31
	x *= 0x9e3779b97f4a7c15
	x ^= x >> 29
	return int(x % uint64(n))
}

func (w *world) storeFault(op, key string) fault {
	if !w.faults.Load() || w.p.storeFault == 0 {
		return faultNone
	}
	x := w.roll(10000, "store", op, key)
	for f := faultBefore; f <= faultCrashAfter; f++ {
		rate := w.p.storeFault
		if f == faultCrashAfter {
			rate /= 4
		}
		if x < rate {
			return f
		}
		x -= rate
	}
	return faultNone
}

func (w *world) count(what string) {
	w.mu.Lock()
	w.countLocked(what)
	w.mu.Unlock()
}

// countLocked is count with w.mu held.
func (w *world) countLocked(what string) {
	w.counts[what]++
	w.note("%s", what)
}

// note keeps a line of the run's story under -sim.trace; w.mu is held.
func (w *world) note(format string, args ...any) {
	if w.verbose {
		w.lines = append(w.lines, fmt.Sprintf("%12v ", since())+fmt.Sprintf(format, args...))
	}
}

func (w *world) violate(format string, args ...any) {
	w.violations = append(w.violations, fmt.Sprintf("at %v: ", since())+fmt.Sprintf(format, args...))
}

func (w *world) sh(key string) *shadowRec {
	s := w.shadow[key]
	if s == nil {
		s = &shadowRec{}
		w.shadow[key] = s
	}
	return s
}

// apply runs one store call atomically, then checks that a completed
// record kept its answer.
func (w *world) apply(ctx context.Context, op, key, token string, mutating bool, call func(ctx context.Context) error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := call(ctx)
	w.ops++
	h := fnv.New64a()
	fmt.Fprintf(h, "%d %s %d %v", since(), op, w.keyIdx[key], err == nil)
	w.trace += h.Sum64() // a sum: calls made at one virtual instant by several goroutines may come in any order
	w.note("%-12s key %d %s err=%v", op, w.keyIdx[key], short(token), err)
	if mutating && key != "" {
		w.checkCompleted(key)
	}
	return err
}

// checkCompleted: once a record completed, it stays completed with the
// same answer (the retention outlasts the run); w.mu is held.
func (w *world) checkCompleted(key string) {
	rec, found, _ := w.mem.Get(context.Background(), key)
	sh := w.sh(key)
	switch {
	case sh.completed == nil && found && rec.State == idem.StateCompleted:
		sh.completed = rec.Response
	case sh.completed != nil && (!found || rec.State != idem.StateCompleted):
		w.violate("key %d: completed record became %v (found %v)", w.keyIdx[key], rec.State, found)
	case sh.completed != nil && string(rec.Response) != string(sh.completed):
		w.violate("key %d: completed record's answer changed from %q to %q", w.keyIdx[key], sh.completed, rec.Response)
		sh.completed = rec.Response
	}
}

// acquired records token taking the key (acquire or claim), which must
// take it from nobody, or from a holder whose lease ended and who did not
// suspend it; a released key only by an acquire; w.mu is held.
func (w *world) acquired(key, token string, d time.Duration, fresh bool, op string) {
	sh := w.sh(key)
	switch {
	case sh.holder != "" && sh.suspended:
		w.violate("key %d: %s took over a suspended (uncertain) record of %s", w.keyIdx[key], op, short(sh.holder))
	case sh.holder != "" && time.Now().Before(sh.leaseEnd):
		w.violate("key %d: %s took over the live lease of %s (%v left)", w.keyIdx[key], op, short(sh.holder), time.Until(sh.leaseEnd))
	case sh.released && op == "claim":
		w.violate("key %d: a recoverer claimed a released key", w.keyIdx[key])
	}
	sh.holder, sh.leaseEnd, sh.suspended, sh.released = token, time.Now().Add(d), false, false
	if fresh {
		sh.incarnation++
	}
}

// wrote checks a write that succeeded for token: the token holds the key
// (no acquire or claim by another since its own, no completion, release
// or resolve), and its lease was live, or it suspended the record and
// suspendedOK. w.mu is held.
func (w *world) wrote(key, token, op string, suspendedOK bool) {
	sh := w.sh(key)
	switch {
	case sh.holder != token:
		w.violate("key %d: %s by a fenced-out token (holder %q, writer %q)", w.keyIdx[key], op, short(sh.holder), short(token))
	case !time.Now().Before(sh.leaseEnd) && !(suspendedOK && sh.suspended):
		w.violate("key %d: %s after the writer's lease ended (%v ago)", w.keyIdx[key], op, time.Since(sh.leaseEnd))
	}
}

func short(token string) string {
	if len(token) > 8 {
		return "…" + token[len(token)-8:]
	}
	return token
}

// instance is one process: an engine over its own connection to the
// shared store, and its recoverer. A crash kills it for good (its slot may
// start a new instance); a stall freezes all of it (handlers, renewals,
// recoverer, store calls) for a while.
type instance struct {
	w          *world
	slot, gen  int
	eng        *idem.Engine
	rec        *idem.Recoverer
	http       http.Handler // the service's HTTP chain: idemhttp around the handler
	dead       bool         // under w.mu
	deadCh     chan struct{}
	stallUntil time.Time // under w.mu
	stop       context.CancelFunc
}

func (w *world) startInstance(slot, gen int) *instance {
	inst := &instance{w: w, slot: slot, gen: gen, deadCh: make(chan struct{})}
	st := &store{w: w, inst: inst}
	eng, err := idem.New(st, idem.WithLease(lease), idem.WithStoreTimeout(storeTimeout), idem.WithLogger(w.log),
		idem.WithCompletionRetry(10*time.Second), idem.WithRecovery(keyHeader),
		idem.WithEventHook(func(_ context.Context, ev idem.Event) {
			if ev.Kind == idem.EventAbandoned {
				w.count("abandoned")
			}
		}))
	if err != nil {
		panic(err)
	}
	inst.eng = eng
	inst.http = w.httpChain(inst)
	rec, err := idem.NewRecoverer(eng, idem.RecoverConcurrency(1), idem.RecoverAttempts(3), idem.RecoverBackoff(time.Second, 8*time.Second),
		idem.RecoverRequests(idem.HTTPRunner(inst.http)))
	if err != nil {
		panic(err)
	}
	inst.rec = rec
	w.mu.Lock()
	w.started = append(w.started, inst)
	w.mu.Unlock()
	rec.Handle(opName, func(ctx context.Context, op idem.Operation) error {
		r := w.newRun(inst, op.Key, string(op.Payload), "recovery")
		_, err := idem.Do(context.WithValue(ctx, runKey{}, r), eng, op, w.handler(r))
		r.finish()
		return err
	})
	ctx, cancel := context.WithCancel(context.Background())
	inst.stop = cancel
	w.wg.Add(1)
	go func() { // the recoverer's passes, at times the seed decides
		defer w.wg.Done()
		for {
			d := time.Second + time.Duration(w.roll(3000, "recoverer", fmt.Sprint(slot, gen)))*time.Millisecond
			select {
			case <-ctx.Done():
				return
			case <-w.end:
				return
			case <-time.After(d):
			}
			inst.waitStall()
			if inst.isDead() {
				return
			}
			rep, _ := rec.RecoverOnce(ctx)
			if rep.Recovered > 0 {
				w.count("recovered")
			}
		}
	}()
	return inst
}

func (inst *instance) isDead() bool {
	inst.w.mu.Lock()
	defer inst.w.mu.Unlock()
	return inst.dead
}

func (inst *instance) crash(where string) {
	w := inst.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if inst.dead {
		return
	}
	inst.dead = true
	close(inst.deadCh)
	w.countLocked("crash")
	w.note("crash of instance %d.%d at %s", inst.slot, inst.gen, where)
}

func (inst *instance) stall(d time.Duration) {
	w := inst.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if until := time.Now().Add(d); until.After(inst.stallUntil) {
		inst.stallUntil = until
	}
	w.countLocked("stall")
	w.note("stall of instance %d.%d for %v", inst.slot, inst.gen, d)
}

// waitStall returns once the instance is not stalled.
func (inst *instance) waitStall() {
	for {
		inst.w.mu.Lock()
		until := inst.stallUntil
		inst.w.mu.Unlock()
		d := time.Until(until)
		if d <= 0 {
			return
		}
		time.Sleep(d)
	}
}

// Requests of the HTTP door: POST /pay, the key's index in keyHeader (kept
// for recovery), the payload as the body; principal is every client's.
const (
	keyHeader = "X-Sim-Key"
	principal = "client"
)

// httpChain is an instance's HTTP service: the operation's handler behind
// idemhttp, whose scope re-establishes a recovery run's principal. A
// request that carries no run (a recoverer's) gets one.
func (w *world) httpChain(inst *instance) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /pay", func(rw http.ResponseWriter, req *http.Request) {
		r := req.Context().Value(runKey{}).(*run)
		body, _ := io.ReadAll(req.Body)
		r.payload = string(body)
		v, err := w.handler(r)(req.Context())
		switch {
		case err == nil:
			b, _ := json.Marshal(v)
			rw.Header().Set("Content-Type", "application/json")
			_, _ = rw.Write(b)
		case errors.Is(err, idem.ErrPermanent):
			rw.Header().Set("Content-Type", "text/plain")
			rw.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = rw.Write([]byte(err.Error()))
		default:
			http.Error(rw, err.Error(), http.StatusInternalServerError)
		}
	})
	eng := inst.eng
	chain := idemhttp.New(eng, idemhttp.WithScope(func(req *http.Request) string {
		if p, ok := eng.RecoveryPrincipal(req.Header.Get(idem.RecoveryHeader)); ok {
			return p
		}
		return principal
	}))(mux)
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if _, ok := req.Context().Value(runKey{}).(*run); !ok {
			r := w.newRun(inst, req.Header.Get(keyHeader), "", "recovery")
			req = req.WithContext(context.WithValue(req.Context(), runKey{}, r))
			defer r.finish()
		}
		chain.ServeHTTP(rw, req)
	})
}

// run is one execution of the handler: a client's Do or a recoverer's.
type run struct {
	w       *world
	inst    *instance
	key     int
	payload string
	who     string
	token   string         // the lease token its steps were started with (under w.mu)
	stepInc map[string]int // the record's incarnation when each step started (under w.mu)
	done    bool           // the handler's goroutine returned (under w.mu)
}

type runKey struct{}

func (w *world) newRun(inst *instance, key, payload, who string) *run {
	var k int
	_, _ = fmt.Sscanf(key, "k%d", &k)
	return &run{w: w, inst: inst, key: k, payload: payload, who: who, stepInc: map[string]int{}}
}

func (r *run) finish() {
	r.w.mu.Lock()
	r.done = true
	r.w.mu.Unlock()
}

var errCrashed = errors.New("sim: the instance crashed under the handler")

// point is a place in the handler where the seed may crash or stall the
// instance; time passes there (the handler's own work).
func (r *run) point(name string) error {
	w := r.w
	time.Sleep(time.Duration(1+w.roll(200, "pause", name, r.who, fmt.Sprint(r.key)))*time.Millisecond + time.Duration(w.roll(1000, "ns", name))*time.Nanosecond)
	if w.faults.Load() {
		x := w.roll(10000, "point", name, fmt.Sprint(r.key))
		switch {
		case x < w.p.yieldCrash:
			r.inst.crash(name)
		case x < w.p.yieldCrash+w.p.yieldStall:
			r.inst.stall(lease + time.Duration(w.roll(int(2*lease/time.Millisecond), "stall", name))*time.Millisecond)
		}
	}
	r.inst.waitStall()
	if r.inst.isDead() {
		<-w.end // a dead process does nothing more
		return errCrashed
	}
	return nil
}

// sideEffect is the step's effect in the outside world (a charge, a
// mail), recorded with the token of the run that made it.
func (r *run) sideEffect(step string, repeatable bool) (string, error) {
	w := r.w
	r.inst.waitStall()
	w.mu.Lock()
	if r.inst.dead {
		w.mu.Unlock()
		<-w.end
		return "", errCrashed
	}
	k := w.keys[r.key]
	sh := w.sh(k)
	v := fmt.Sprintf("%s-%d-%d", step, r.key, since().Nanoseconds())
	e := effect{key: r.key, step: step, token: r.token, incarnation: r.stepInc[step], repeatable: repeatable,
		fenced: sh.holder != r.token || !time.Now().Before(sh.leaseEnd), at: since(), value: v}
	w.effects = append(w.effects, e)
	if e.fenced {
		w.counts["effect-by-fenced-holder"]++
	}
	w.mu.Unlock()
	return v, nil
}

// Result is the operation's answer: the results of its two steps.
type Result struct {
	Charge, Mail string
}

// handler is the operation: a charge (a step that is not Repeatable: at
// most once), a mail (Repeatable: may run again after a crash), then the
// answer, or, for the payload "decline", a Permanent error.
func (w *world) handler(r *run) func(ctx context.Context) (Result, error) {
	return func(ctx context.Context) (Result, error) {
		if err := r.point("start"); err != nil {
			return Result{}, err
		}
		charge, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			if err := r.point("charge-before"); err != nil {
				return "", err
			}
			v, err := r.sideEffect("charge", false)
			if err != nil {
				return "", err
			}
			if err := r.point("charge-after"); err != nil {
				return "", err
			}
			return v, nil
		})
		if err != nil {
			return Result{}, err
		}
		if err := r.point("between"); err != nil {
			return Result{}, err
		}
		mail, err := idem.Step(ctx, "mail", func(ctx context.Context) (string, error) {
			if err := r.point("mail-before"); err != nil {
				return "", err
			}
			v, err := r.sideEffect("mail", true)
			if err != nil {
				return "", err
			}
			if err := r.point("mail-after"); err != nil {
				return "", err
			}
			return v, nil
		}, idem.Repeatable())
		if err != nil {
			return Result{}, err
		}
		if err := r.point("end"); err != nil {
			return Result{}, err
		}
		if r.payload == "decline" {
			return Result{}, idem.Permanent(fmt.Errorf("declined after %s", charge))
		}
		return Result{Charge: charge, Mail: mail}, nil
	}
}

// client sends one operation until it gets a final answer.
type client struct {
	id      int
	key     int
	payload string
	final   string // "value:<json>", "stored-error:<msg>", "mismatch", or "" (none before it stopped)
	tries   int
}

func (w *world) runClient(c *client) {
	defer w.wg.Done()
	r := rand.New(rand.NewPCG(w.seed, uint64(1000+c.id)))
	time.Sleep(time.Duration(r.Int64N(int64(chaos/2))) + time.Duration(c.id))
	op := idem.Operation{Name: opName, Key: fmt.Sprintf("k%d", c.key), Payload: []byte(c.payload), Recover: true}
	for since() < clientsStop {
		c.tries++
		inst := w.liveInstance(r)
		if inst == nil {
			time.Sleep(time.Second)
			continue
		}
		run := w.newRun(inst, op.Key, c.payload, fmt.Sprintf("client%d/%d", c.id, c.tries))
		got := make(chan answer, 1)
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			ctx := context.WithValue(w.ctx, runKey{}, run)
			if !w.p.http[c.key] {
				v, err := idem.Do(ctx, inst.eng, op, w.handler(run))
				run.finish()
				got <- answer{v, err}
				return
			}
			req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader(c.payload))
			req.Header.Set("Content-Type", "text/plain")
			req.Header.Set("Idempotency-Key", `"`+op.Key+`"`)
			req.Header.Set(keyHeader, op.Key)
			rec := httptest.NewRecorder()
			inst.http.ServeHTTP(rec, req)
			run.finish()
			got <- httpAnswer(rec)
		}()
		var a answer
		select {
		case a = <-got:
		case <-inst.deadCh: // the consumer died with its instance: the message comes again
			w.count("client-attempt-lost")
			time.Sleep(time.Duration(r.Int64N(int64(2 * time.Second))))
			continue
		case <-time.After(3 * lease): // stalled: the client gives up on this attempt
			w.count("client-attempt-timeout")
			continue
		}
		var stored *idem.StoredError
		switch {
		case a.err == nil:
			b, _ := json.Marshal(a.v)
			c.final = "value:" + string(b)
			return
		case errors.As(a.err, &stored):
			c.final = "stored-error:" + stored.Message
			return
		case errors.Is(a.err, idem.ErrPermanent):
			c.final = "stored-error:" + a.err.Error()
			return
		case errors.Is(a.err, idem.ErrMismatch):
			c.final = "mismatch"
			return
		case errors.Is(a.err, idem.ErrUncertain):
			w.count("client-uncertain")
		}
		time.Sleep(time.Duration(200+r.IntN(3000)) * time.Millisecond)
	}
}

// answer is what one attempt of a client got.
type answer struct {
	v   Result
	err error
}

// httpAnswer reads an HTTP answer as Do would return it: 200 a Result, 422
// the engine's key-reused problem a mismatch, 422 the handler's own a
// permanent error, anything else an error to retry.
func httpAnswer(rec *httptest.ResponseRecorder) answer {
	body := rec.Body.String()
	switch {
	case rec.Code == http.StatusOK:
		var v Result
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			return answer{err: err}
		}
		return answer{v: v}
	case rec.Code == http.StatusUnprocessableEntity && strings.HasPrefix(rec.Header().Get("Content-Type"), "application/problem+json"):
		return answer{err: idem.ErrMismatch}
	case rec.Code == http.StatusUnprocessableEntity:
		return answer{err: &idem.StoredError{Message: body}}
	case rec.Code == http.StatusConflict && strings.Contains(body, "uncertain"):
		return answer{err: idem.ErrUncertain}
	}
	return answer{err: fmt.Errorf("HTTP %d: %s", rec.Code, body)}
}

// liveInstance picks an instance that is not dead, nil when all are.
func (w *world) liveInstance(r *rand.Rand) *instance {
	w.mu.Lock()
	defer w.mu.Unlock()
	var live []*instance
	for _, in := range w.insts {
		if !in.dead {
			live = append(live, in)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return live[r.IntN(len(live))]
}

// scheduleFaults crashes, stalls and restarts instances during the chaos
// phase, then restarts the dead ones and turns faults off.
func (w *world) scheduleFaults() {
	defer w.wg.Done()
	r := rand.New(rand.NewPCG(w.seed, 7))
	for i := 0; i < w.p.instFaults; i++ {
		time.Sleep(time.Duration(r.Int64N(int64(chaos / time.Duration(w.p.instFaults+1)))))
		slot := r.IntN(len(w.insts))
		w.mu.Lock()
		inst := w.insts[slot]
		w.mu.Unlock()
		switch {
		case inst.isDead():
			w.restart(slot)
		case r.IntN(2) == 0:
			inst.crash("scheduled")
		default:
			inst.stall(lease + time.Duration(r.Int64N(int64(2*lease))))
		}
	}
	time.Sleep(time.Until(epoch.Add(chaos)))
	w.faults.Store(false)
	for slot := range w.insts {
		if w.insts[slot].isDead() {
			w.restart(slot)
		}
	}
}

func (w *world) restart(slot int) {
	w.mu.Lock()
	old := w.insts[slot]
	w.mu.Unlock()
	inst := w.startInstance(slot, old.gen+1)
	w.mu.Lock()
	w.insts[slot] = inst
	w.counts["restart"]++
	w.mu.Unlock()
}

// operate is the operator: every few seconds, for each record that is
// uncertain or in progress with its lease lapsed, it settles one step
// started and not done ([idem.ResolveStep]) as it truly went: done with
// its effect's value when the effect happened, not done when the run that
// started it is over (returned, or its instance dead) without an effect.
// A step whose starter may still act (stalled) is left alone: no operator
// can know the future.
func (w *world) operate() {
	defer w.wg.Done()
	op := &store{w: w}
	r := rand.New(rand.NewPCG(w.seed, 11))
	for since() < operatorStop {
		time.Sleep(2*time.Second + time.Duration(r.Int64N(int64(3*time.Second))))
		for _, key := range w.keys {
			steps, err := op.Steps(w.ctx, key)
			if err != nil {
				continue
			}
			for _, st := range steps {
				if st.Done {
					continue
				}
				w.mu.Lock()
				var val string
				var happened, over bool
				for _, e := range w.effects {
					if w.keys[e.key] == key && e.step == st.Name && e.token == st.Token {
						happened, val = true, e.value
					}
				}
				if run := w.tokens[st.Token]; run != nil {
					over = run.done || run.inst.dead
				}
				w.mu.Unlock()
				switch {
				case happened:
					b, _ := json.Marshal(val)
					if idem.ResolveStep(w.ctx, op, key, st.Name, b, true) == nil {
						w.count("operator-resolve-done")
					}
				case over:
					if idem.ResolveStep(w.ctx, op, key, st.Name, nil, false) == nil {
						w.count("operator-resolve-not-done")
					}
				}
				break
			}
		}
	}
}

// runWorld plays seed's run and returns what it found wrong.
func runWorld(seed uint64, strict, verbose bool) (w *world, problems []string) {
	w = newWorld(seed)
	w.verbose = verbose
	for slot := range w.p.instances {
		w.insts = append(w.insts, w.startInstance(slot, 0))
	}
	pr := rand.New(rand.NewPCG(seed, 3))
	for i := range w.p.clients {
		c := &client{id: i, key: pr.IntN(w.p.keys), payload: "pay"}
		if pr.Float64() < w.p.reuse {
			c.payload = "decline"
		}
		w.clients = append(w.clients, c)
		w.wg.Add(1)
		go w.runClient(c)
	}
	w.wg.Add(1)
	go w.scheduleFaults()
	if w.p.operator {
		w.wg.Add(1)
		go w.operate()
	}
	time.Sleep(horizon)
	close(w.end) // crashed handlers return; recoverers stop
	for _, in := range w.allInstances() {
		in.stop()
	}
	w.wg.Wait()
	closeCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	for _, in := range w.allInstances() {
		_ = in.eng.Close(closeCtx)
	}
	cancel()
	return w, w.check(strict)
}

// allInstances is every instance the run started, dead ones included.
func (w *world) allInstances() []*instance {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.started)
}

// check returns the invariants the run broke.
func (w *world) check(strict bool) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	problems := slices.Clone(w.violations)
	// At most one run of a non-Repeatable step's effect per key, across
	// journals too: an execution that ends without an answer after a step
	// finished keeps its journal (its lease lapses), and a record is
	// released only before any step finished.
	type stepKey struct {
		key  int
		step string
	}
	byStep := map[stepKey][]effect{}
	for _, e := range w.effects {
		if !e.repeatable {
			byStep[stepKey{e.key, e.step}] = append(byStep[stepKey{e.key, e.step}], e)
		}
	}
	for sk, es := range byStep {
		if len(es) > 1 {
			problems = append(problems, fmt.Sprintf("key %d: step %q (not Repeatable) ran %d times: %s", sk.key, sk.step, len(es), describe(es)))
		}
	}
	// Every record whose holder stopped is completed, recovered, or
	// parked uncertain by the horizon (or gone: released, or lapsed
	// before anything was journaled).
	stored := map[int]idem.Record{}
	for i, key := range w.keys {
		rec, found, err := w.mem.Get(context.Background(), key)
		if err != nil {
			problems = append(problems, fmt.Sprintf("key %d: %v", i, err))
			continue
		}
		if found && rec.State == idem.StateInProgress {
			steps, _ := w.mem.Steps(context.Background(), key)
			problems = append(problems, fmt.Sprintf("key %d: still in progress at the horizon (%d steps journaled)", i, len(steps)))
		}
		if found && rec.State == idem.StateUncertain && w.p.operator {
			// The operator settles every step whose starter is over, and
			// every starter is over long before it stops (faults end at
			// chaos): a record left uncertain on such a step means a
			// settlement did not take.
			steps, _ := w.mem.Steps(context.Background(), key)
			for _, st := range steps {
				if run := w.tokens[st.Token]; !st.Done && run != nil && (run.done || run.inst.dead) {
					problems = append(problems, fmt.Sprintf("key %d: uncertain at the horizon on step %q, which the operator settles", i, st.Name))
				}
			}
		}
		door := "do"
		if w.p.http[i] {
			door = "http"
		}
		if found {
			stored[i] = rec
			w.counts["end-"+door+"-"+rec.State.String()]++
		} else {
			w.counts["end-"+door+"-absent"]++
		}
	}
	// Every client's final answer is the stored one.
	for _, c := range w.clients {
		if c.final == "" || c.final == "mismatch" {
			if c.final == "mismatch" && !w.reused(c.key) {
				problems = append(problems, fmt.Sprintf("client %d: mismatch on key %d that no client used with another payload", c.id, c.key))
			}
			continue
		}
		rec, ok := stored[c.key]
		if ok && rec.State == idem.StateUncertain && !strict && w.journalSays(c.key, c.final) {
			// Do returned the answer (a result or a permanent error)
			// although its completion failed (its lease lapsed under it;
			// documented for stores without transactions), then the
			// record's recoveries were spent on faults and it was parked.
			// Its journal holds exactly the answer given: nothing
			// contradicts it, an operator completes it. Counted, failing
			// under -sim.strict.
			w.counts["client-answered-record-parked"]++
			continue
		}
		if !ok || rec.State != idem.StateCompleted {
			problems = append(problems, fmt.Sprintf("client %d: answered %s, but key %d is %v at the horizon", c.id, c.final, c.key, rec.State))
			continue
		}
		want, err := storedAnswer(rec)
		if err != nil {
			problems = append(problems, fmt.Sprintf("key %d: %v", c.key, err))
			continue
		}
		if want != c.final {
			problems = append(problems, fmt.Sprintf("client %d: answered %s, stored %s", c.id, c.final, want))
		}
	}
	// A stored charge is a charge that happened.
	for i, rec := range stored {
		if rec.State != idem.StateCompleted {
			continue
		}
		resp, err := idem.DecodeResponse(rec.Response)
		if err != nil || resp.Status != 200 {
			continue
		}
		var v Result
		_ = json.Unmarshal(resp.Body, &v)
		if !slices.ContainsFunc(w.effects, func(e effect) bool { return e.key == i && e.step == "charge" && e.value == v.Charge }) {
			problems = append(problems, fmt.Sprintf("key %d: stored charge %q never happened", i, v.Charge))
		}
	}
	return problems
}

// storedAnswer returns a completed record's answer as a client writes it.
func storedAnswer(rec idem.Record) (string, error) {
	resp, err := idem.DecodeResponse(rec.Response)
	if err != nil {
		return "", fmt.Errorf("stored answer unreadable: %w", err)
	}
	if resp.Status != 200 {
		return "stored-error:" + string(resp.Body), nil
	}
	var v Result
	_ = json.Unmarshal(resp.Body, &v)
	b, _ := json.Marshal(v)
	return "value:" + string(b), nil
}

// journalSays reports whether the journal of key holds the steps' results
// of the answer final ("value:" JSON of a Result, or the permanent error
// "declined after" the charge); w.mu is held.
func (w *world) journalSays(key int, final string) bool {
	var v Result
	declined, isDeclined := strings.CutPrefix(final, "stored-error:declined after ")
	switch {
	case isDeclined:
		v.Charge = declined
	case !strings.HasPrefix(final, "value:") || json.Unmarshal([]byte(strings.TrimPrefix(final, "value:")), &v) != nil:
		return false
	}
	steps, _ := w.mem.Steps(context.Background(), w.keys[key])
	results := map[string]string{}
	for _, st := range steps {
		out, err := idem.DecodeStep(st)
		if err != nil || !out.Done || out.Err != nil {
			continue
		}
		var s string
		_ = json.Unmarshal(out.Value, &s)
		results[st.Name] = s
	}
	_, mailed := results["mail"]
	return results["charge"] == v.Charge && (results["mail"] == v.Mail || isDeclined && mailed)
}

func (w *world) reused(key int) bool {
	payloads := map[string]bool{}
	for _, c := range w.clients {
		if c.key == key {
			payloads[c.payload] = true
		}
	}
	return len(payloads) > 1
}

func describe(es []effect) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, fmt.Sprintf("[at %v by %s, journal #%d, fenced %v]", e.at, short(e.token), e.incarnation, e.fenced))
	}
	return strings.Join(parts, " ")
}

// summary is the run's counters, sorted, for -v.
func (w *world) summary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var parts []string
	for k, v := range w.counts {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return fmt.Sprintf("ops=%d effects=%d %s", w.ops, len(w.effects), strings.Join(parts, " "))
}
