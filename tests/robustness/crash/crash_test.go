package crash

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// Timing of every scenario: the lease is renewed every lease/3, so an
// execution of handlerDur renews it twice, and one failed renewal leaves
// it more than a second (a loaded machine's stall) before it lapses; a
// delayed call lands after the caller's store timeout.
const (
	storeTimeout = 400 * time.Millisecond
	lease        = 6 * storeTimeout
	handlerDur   = 1800 * time.Millisecond
	delay        = 2 * storeTimeout
)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.parallel"); f != nil && f.Value.String() == f.DefValue {
		_ = f.Value.Set("8") // scenarios mostly wait: run them 8 at a time
	}
	goleak.VerifyTestMain(m)
}

// scenario is one execution of a key by two clients under plan.
type scenario struct {
	name string
	plan []storetest.Injection
	// failFirst: the first execution's handler fails, so the engine
	// releases the key and a client's retry executes it again.
	failFirst bool
}

// scenarios enumerates the crash points of an execution whose fault-free
// run made calls: each of its calls under each fault (acquires: the
// execution's and the first duplicates'), the completion's check of a
// lost reply (Get), the background completion retry (after two failed
// completions), and the release of a failed execution.
func scenarios(calls map[storetest.Call]int) []scenario {
	var out []scenario
	add := func(name string, failFirst bool, base []storetest.Injection, c storetest.Call, n int) {
		for _, f := range storetest.Faults {
			in := storetest.Injection{Call: c, N: n, Fault: f}
			out = append(out, scenario{name: name + "/" + in.String(), plan: append(append([]storetest.Injection(nil), base...), in), failFirst: failFirst})
		}
	}
	for n := 1; n <= min(calls[storetest.CallAcquire], 3); n++ {
		add("acquire", false, nil, storetest.CallAcquire, n)
	}
	for n := 1; n <= calls[storetest.CallExtend]; n++ {
		add("renewal", false, nil, storetest.CallExtend, n)
	}
	add("completion", false, nil, storetest.CallComplete, 1)
	lost := []storetest.Injection{{Call: storetest.CallComplete, N: 1, Fault: storetest.FaultLoseReply}}
	add("completion-check", false, lost, storetest.CallGet, 1)
	failed := []storetest.Injection{{Call: storetest.CallComplete, N: 1, Fault: storetest.FaultFail}, {Call: storetest.CallComplete, N: 2, Fault: storetest.FaultFail}}
	add("background-completion", false, failed, storetest.CallComplete, 3)
	add("background-completion", false, append(failed, storetest.Injection{Call: storetest.CallComplete, N: 3, Fault: storetest.FaultFail}), storetest.CallComplete, 4)
	add("release", true, nil, storetest.CallRelease, 1)
	return out
}

type receipt struct {
	ID string `json:"id"`
}

// outcome is what a scenario observed.
type outcome struct {
	calls    map[storetest.Call]int
	injected []storetest.Injection
	retries  int // 503 / 409 / handler errors the clients retried
}

var errHandler = errors.New("handler failed")

// run runs sc on inner and checks the engine's promises: never two
// executions of the key at once, exactly one successful execution, every
// client's answer (and a later replay) its receipt, the stored record its
// response, and only retry signals (503, 409, the failed handler's error)
// on the way.
func run(t *testing.T, inner idem.Store, sc scenario) outcome {
	s, fs := storetest.NewFaultStore(inner, delay, sc.plan...)
	e, err := idem.New(s, idem.WithLease(lease), idem.WithStoreTimeout(storeTimeout), idem.WithCompletionRetry(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	op := idem.Operation{Scope: "crash", Name: "charge", Key: rand.Text(), Payload: []byte(`{"amount":100}`)}
	var running, maxRunning, attempts atomic.Int32
	var mu sync.Mutex
	var succeeded, answers []string
	fn := func(context.Context) (receipt, error) {
		r := running.Add(1)
		defer running.Add(-1)
		for m := maxRunning.Load(); r > m && !maxRunning.CompareAndSwap(m, r); m = maxRunning.Load() {
		}
		n := attempts.Add(1)
		time.Sleep(handlerDur)
		if sc.failFirst && n == 1 {
			return receipt{}, errHandler
		}
		id := fmt.Sprintf("pay_%d", n)
		mu.Lock()
		succeeded = append(succeeded, id)
		mu.Unlock()
		return receipt{ID: id}, nil
	}
	var retries atomic.Int32
	client := func(ctx context.Context) {
		for ctx.Err() == nil {
			v, err := idem.Do(ctx, e, op, fn)
			switch {
			case err == nil:
				mu.Lock()
				answers = append(answers, v.ID)
				mu.Unlock()
				return
			case errors.Is(err, idem.ErrUnavailable), errors.Is(err, idem.ErrInProgress), errors.Is(err, errHandler):
				retries.Add(1)
				time.Sleep(100 * time.Millisecond)
			default:
				t.Errorf("%s: a client got %v: neither an answer nor a signal to retry", sc.name, err)
				return
			}
		}
		t.Errorf("%s: a client got no answer within its deadline", sc.name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { client(ctx) })
	time.Sleep(150 * time.Millisecond)
	wg.Go(func() { client(ctx) })
	wg.Wait()
	before := attempts.Load()
	client(ctx) // a later retry: a replay, fn does not run
	if attempts.Load() != before {
		t.Errorf("%s: a retry after both answers executed the key again", sc.name)
	}
	closeCtx, closeCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer closeCancel()
	if err := e.Close(closeCtx); err != nil {
		t.Errorf("%s: engine Close: %v", sc.name, err)
	}
	fs.Wait()

	if m := maxRunning.Load(); m > 1 {
		t.Errorf("%s: %d executions of the key ran at once", sc.name, m)
	}
	if len(succeeded) != 1 {
		t.Fatalf("%s: %d successful executions %v, want 1", sc.name, len(succeeded), succeeded)
	}
	for _, a := range answers {
		if a != succeeded[0] {
			t.Errorf("%s: a client got %s, the execution returned %s", sc.name, a, succeeded[0])
		}
	}
	keys := fs.Keys()
	if len(keys) != 1 {
		t.Fatalf("%s: %d keys acquired, want 1", sc.name, len(keys))
	}
	rec, found, err := inner.Get(context.Background(), keys[0])
	if err != nil || !found || rec.State != idem.StateCompleted {
		t.Fatalf("%s: stored record %v found %v err %v, want completed", sc.name, rec.State, found, err)
	}
	resp, err := idem.DecodeResponse(rec.Response)
	if err != nil || !strings.Contains(string(resp.Body), `"`+succeeded[0]+`"`) {
		t.Errorf("%s: stored response %q (%v), want the receipt of %s", sc.name, resp.Body, err, succeeded[0])
	}
	return outcome{calls: fs.Calls(), injected: fs.Injected(), retries: int(retries.Load())}
}

// crashPoints runs the fault-free execution, then every scenario.
func crashPoints(t *testing.T, newStore func(t *testing.T) idem.Store) {
	base := run(t, newStore(t), scenario{name: "fault-free"})
	t.Logf("fault-free execution: calls %v", base.calls)
	if base.calls[storetest.CallExtend] == 0 {
		t.Fatalf("the execution renewed no lease (calls %v)", base.calls)
	}
	var hit, missed atomic.Int32
	for _, sc := range scenarios(base.calls) {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			o := run(t, newStore(t), sc)
			// The injection under test is the last of the plan; the
			// scenario counts only if it hit a call.
			want := sc.plan[len(sc.plan)-1]
			for _, in := range o.injected {
				if in == want {
					hit.Add(1)
					t.Logf("%v hit; %d retries; calls %v", o.injected, o.retries, o.calls)
					return
				}
			}
			missed.Add(1)
			t.Errorf("%v never reached (calls %v): the enumeration missed its crash point", want, o.calls)
		})
	}
	t.Cleanup(func() {
		t.Logf("crash points: %d scenarios hit their call, %d never reached it", hit.Load(), missed.Load())
		fmt.Printf("crash points: %s: %d scenarios, %d hit their call\n", t.Name(), hit.Load()+missed.Load(), hit.Load())
	})
}

func TestCrashPointsMemstore(t *testing.T) {
	crashPoints(t, func(t *testing.T) idem.Store {
		s := memstore.New()
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

func TestCrashPointsRedis(t *testing.T) {
	u := os.Getenv("IDEM_REDIS_URL")
	if u == "" {
		u = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis unreachable at %s (IDEM_REDIS_URL; make test starts one): %v", u, err)
	}
	prefix := "idemcrash:" + rand.Text()[:10] + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Unlink(ctx, iter.Val())
		}
	})
	crashPoints(t, func(*testing.T) idem.Store { return redisstore.New(c, redisstore.WithPrefix(prefix)) })
}
