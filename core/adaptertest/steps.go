package adaptertest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// stepApp is the handler of the Steps check: it calls idem.Step("charge")
// with the request's context, as a handler does, and answers 201 with the
// step's result, the step's derived key ([idem.StepKey]) and the handler
// run's number. With ?crash=1 its first run waits for release after the
// step, as a holder that stops before completing; with ?crash=inside,
// inside the step's function, as a holder that stops mid-step. A step
// error is answered 500 with the error.
type stepApp struct {
	executions atomic.Int64 // handler runs
	charges    atomic.Int64 // runs of the step's function
	journaled  atomic.Int64 // handler runs past idem.Step
	holding    atomic.Int64 // first runs that reached their crash point
	derived    atomic.Pointer[string]
	release    chan struct{}
	once       sync.Once
}

type stepAnswer struct {
	Execution int64  `json:"execution"`
	Charge    string `json:"charge"`
	StepKey   string `json:"step_key"`
}

func (a *stepApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.executions.Add(1)
	ctx := r.Context()
	key, _ := idem.StepKey(ctx, "charge")
	charge, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
		if k, ok := idem.DerivedKey(ctx); ok {
			a.derived.Store(&k)
		}
		c := fmt.Sprintf("ch_%d", a.charges.Add(1))
		if r.URL.Query().Get("crash") == "inside" && n == 1 { // the holder stops inside the step
			a.holding.Add(1)
			select {
			case <-a.release:
			case <-time.After(20 * time.Second):
			}
		}
		return c, nil
	})
	if err != nil {
		http.Error(w, "step: "+err.Error(), http.StatusInternalServerError)
		return
	}
	a.journaled.Add(1)
	if r.URL.Query().Get("crash") == "1" && n == 1 {
		a.holding.Add(1)
		select {
		case <-a.release:
		case <-time.After(20 * time.Second):
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(stepAnswer{Execution: n, Charge: charge, StepKey: key})
}

// CrashableJournal is [Crashable] for a store that also implements
// [idem.Journal], which it keeps: an execution held in its handler past its
// lease looks crashed, and a retry takes it over and resumes from its
// journaled steps ([idem.Step]), for tests of steps after a takeover. It
// panics when s is not a Keeper and a Journal.
func CrashableJournal(s idem.Store) idem.Store {
	return journalStore{Store: s, Keeper: s.(idem.Keeper), Journal: s.(idem.Journal)}
}

type journalStore struct {
	idem.Store
	idem.Keeper
	idem.Journal
}

// testSteps: a handler calling idem.Step with the context its framework
// gives it journals the step: the first run runs it once; after its holder
// stopped and its lease lapsed, the retry that takes the execution over
// gets the journaled result without running the step again, with the same
// 69-character derived key; retries then replay; outside idem (an
// uncovered method, a skipped route) Step runs the function as it is.
func (s *suite) testSteps(t *testing.T) {
	store := s.cfg.NewStore(t)
	if _, ok := store.(idem.Journal); !ok {
		t.Fatalf("%T: the suite's store must implement idem.Journal", store)
	}
	e, err := idem.New(CrashableJournal(store),
		idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithLease(time.Second), idem.WithStoreTimeout(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_ = e.Close(ctx)
	})
	app := &stepApp{release: make(chan struct{})}
	release := func() { app.once.Do(func() { close(app.release) }) }
	t.Cleanup(release)
	base := strings.TrimSuffix(s.cfg.Mount(t, Mount{Engine: e, App: app, Where: s.where, Skip: skipped}), "/")
	t.Cleanup(s.client.CloseIdleConnections)
	decode := func(what string, r result) stepAnswer {
		t.Helper()
		var a stepAnswer
		if r.status != http.StatusCreated {
			t.Fatalf("%s: status %d, body %s; want 201", what, r.status, r.body)
		}
		if err := json.Unmarshal(r.body, &a); err != nil {
			t.Fatalf("%s: body %q: %v", what, r.body, err)
		}
		return a
	}

	charge := call{path: "/a?crash=1", body: `{"amount":1}`, keys: []string{"charge"}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = s.send(base, charge) // the stopped holder: its answer, if any, is not the key's
	}()
	defer wg.Wait()
	defer release()
	for deadline := time.Now().Add(2 * time.Minute); app.journaled.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the first run never got past its step (step runs %d)", app.charges.Load())
		}
	}
	if app.charges.Load() != 1 {
		t.Fatalf("step runs after the first handler run = %d, want 1", app.charges.Load())
	}
	derived := app.derived.Load()
	if derived == nil {
		t.Fatal("idem.DerivedKey in the step: none; the handler's context carries no execution (bind it with Execution.WithInfo)")
	}
	if len(*derived) != 69 || !strings.HasPrefix(*derived, "idem-") {
		t.Fatalf("idem.DerivedKey in the step = %q; want idem- and 64 hex characters", *derived)
	}
	// Retry until the holder's 1s lease has lapsed: 409 in-progress till then.
	var took result
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		took = s.do(t, base, charge)
		if took.status != http.StatusConflict {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stopped holder's lease never lapsed: retries still get 409")
		}
	}
	a := decode("takeover", took)
	if a.Execution != 2 || a.Charge != "ch_1" || app.charges.Load() != 1 {
		t.Fatalf("takeover: %+v, step runs %d; want handler run 2 with the journaled ch_1 and the step not run again", a, app.charges.Load())
	}
	if a.StepKey != *derived {
		t.Fatalf("idem.StepKey on the takeover = %q, want the first run's derived key %q", a.StepKey, *derived)
	}
	release()
	wg.Wait()
	again := s.do(t, base, charge)
	if decode("retry", again) != a || again.header.Get(idem.ReplayedHeader) != "true" || app.charges.Load() != 1 {
		t.Fatalf("retry after the takeover: %s (replayed %q), step runs %d; want the takeover's answer replayed",
			again.body, again.header.Get(idem.ReplayedHeader), app.charges.Load())
	}

	// Outside idem Step runs its function as it is, journaling nothing.
	for _, c := range []call{
		{method: http.MethodGet, path: "/a"},
		{method: http.MethodGet, path: "/a"},
		{path: "/skipped", body: `{}`, keys: []string{"charge"}},
		{path: "/skipped", body: `{}`, keys: []string{"charge"}},
	} {
		before := app.charges.Load()
		p := decode(c.method+" "+c.path, s.do(t, base, c))
		if app.charges.Load() != before+1 || p.StepKey != "" || p.Charge != fmt.Sprintf("ch_%d", before+1) {
			t.Fatalf("%s %s outside idem: %+v, step runs %d -> %d; want the step run, no derived key", c.method, c.path, p, before, app.charges.Load())
		}
	}
}
