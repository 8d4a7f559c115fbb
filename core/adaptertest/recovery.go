package adaptertest

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// CrashableRecoverable is [CrashableJournal] for a store that also
// implements [idem.Recoverable] and [idem.StepResolver], which it keeps:
// an execution held in its handler past its lease looks crashed, and a
// [idem.Recoverer] finds and claims it. It panics when s lacks one of
// those interfaces.
func CrashableRecoverable(s idem.Store) idem.Store {
	return recoverableStore{Store: s, Keeper: s.(idem.Keeper), Journal: s.(idem.Journal),
		Recoverable: s.(idem.Recoverable), StepResolver: s.(idem.StepResolver)}
}

type recoverableStore struct {
	idem.Store
	idem.Keeper
	idem.Journal
	idem.Recoverable
	idem.StepResolver
}

// LoopbackRunner returns an [idem.Runner] that sends each recovered
// request to base (a URL [Config.Mount] returned) with client, through the
// mounted adapter's whole chain, as [idem.HTTPRunner] runs it in process.
func LoopbackRunner(client *http.Client, base string) idem.Runner {
	return func(req *http.Request) (int, error) {
		u, err := url.Parse(strings.TrimSuffix(base, "/") + req.URL.RequestURI())
		if err != nil {
			return 0, err
		}
		req.URL, req.Host, req.RequestURI = u, u.Host, ""
		resp, err := client.Do(req) //nolint:gosec // the test's own loopback server
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
}

// recoveryEngine returns an engine over a crashable copy of the suite's
// store with 1s leases and recovery on every route (the suite's
// principal header declared, standing for the service's authentication
// hook, [idem.Engine.RecoveryPrincipal]), the App mounted behind it, and
// a recoverer running requests through the mount.
func (s *suite) recoveryEngine(t *testing.T) (*idem.Engine, *stepApp, string, *idem.Recoverer) {
	store := s.cfg.NewStore(t)
	if _, ok := store.(idem.Recoverable); !ok {
		t.Fatalf("%T: the suite's store must implement idem.Recoverable", store)
	}
	e, err := idem.New(CrashableRecoverable(store), idem.WithLogger(slog.New(slog.DiscardHandler)),
		idem.WithLease(time.Second), idem.WithStoreTimeout(250*time.Millisecond), idem.WithRecovery(PrincipalHeader))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_ = e.Close(ctx)
	})
	app := &stepApp{release: make(chan struct{})}
	t.Cleanup(func() { app.once.Do(func() { close(app.release) }) })
	base := strings.TrimSuffix(s.cfg.Mount(t, Mount{Engine: e, App: app, Where: s.where, Skip: skipped}), "/")
	t.Cleanup(s.client.CloseIdleConnections)
	rec, err := idem.NewRecoverer(e, idem.RecoverRequests(LoopbackRunner(s.client, base)), idem.RecoverBackoff(50*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return e, app, base, rec
}

// crash sends c and returns once its first run reached its crash point;
// the client gives up (as a closed browser tab), the held run stays until
// the test ends.
func (s *suite) crash(t *testing.T, app *stepApp, base string, c call) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.ctx = ctx
		_, _ = s.send(base, c)
	}()
	t.Cleanup(func() { app.once.Do(func() { close(app.release) }); cancel(); wg.Wait() })
	for deadline := time.Now().Add(2 * time.Minute); app.holding.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first run never reached its crash point")
		}
	}
	cancel() // nobody comes back
}

// testRecovery: a request whose holder stopped after its step, and whose
// client never came back, is finished by a Recoverer through the
// adapter's chain once its lease lapsed: the journaled step replays (not
// run again), the answer is stored, and the client's late retry gets it
// replayed. A request carrying a forged Idem-Recovery header is refused
// 403 recovery-refused and executes nothing.
func (s *suite) testRecovery(t *testing.T) {
	_, app, base, rec := s.recoveryEngine(t)
	charge := call{path: "/a?crash=1", body: `{"amount":1}`, keys: []string{"pay-1"}}
	s.crash(t, app, base, charge)

	forged := charge
	forged.header = http.Header{idem.RecoveryHeader: {strings.Repeat("ab", 16)}}
	wantProblem(t, s.do(t, base, forged), http.StatusForbidden, "recovery-refused")
	forged.keys = []string{"pay-forged"}
	wantProblem(t, s.do(t, base, forged), http.StatusForbidden, "recovery-refused")
	if n := app.executions.Load(); n != 1 {
		t.Fatalf("handler runs after forged recovery requests = %d, want 1", n)
	}

	ctx := context.Background()
	got := RecoverOne(t, rec)
	if got.Claimed != 1 || got.Deferred != 0 || app.executions.Load() != 2 || app.charges.Load() != 1 {
		t.Fatalf("recovery: %+v, handler runs %d, step runs %d; want one claim recovered by handler run 2, the step not run again",
			got, app.executions.Load(), app.charges.Load())
	}
	late := s.do(t, base, charge)
	var a stepAnswer
	if late.status != http.StatusCreated || late.header.Get(idem.ReplayedHeader) != "true" || json.Unmarshal(late.body, &a) != nil ||
		a.Execution != 2 || a.Charge != "ch_1" {
		t.Fatalf("the client's late retry: %d replayed %q %s; want the recovery run's 201 (execution 2, ch_1) replayed",
			late.status, late.header.Get(idem.ReplayedHeader), late.body)
	}
	if rep, err := rec.RecoverOnce(ctx); err != nil || rep.Due != 0 {
		t.Fatalf("a pass after the recovery: %+v, %v; want nothing due", rep, err)
	}
	if app.executions.Load() != 2 {
		t.Fatalf("handler runs = %d, want 2", app.executions.Load())
	}
}

// testStepUncertainAnswer: the request whose handler finds a step started
// by a holder that stopped mid-step (idem.ErrStepUncertain) is answered
// by idem with 409 operation-uncertain, whatever the handler writes (the
// suite's handler answers 500), and later retries get the same.
func (s *suite) testStepUncertainAnswer(t *testing.T) {
	_, app, base, _ := s.recoveryEngine(t)
	charge := call{path: "/a?crash=inside", body: `{"amount":1}`, keys: []string{"pay-2"}}
	s.crash(t, app, base, charge)
	var took result
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		took = s.do(t, base, charge)
		if took.status != http.StatusConflict || !strings.Contains(string(took.body), "in-progress") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stopped holder's lease never lapsed: retries still get 409 in-progress")
		}
	}
	wantProblem(t, took, http.StatusConflict, "operation-uncertain")
	if app.executions.Load() != 2 || app.charges.Load() != 1 {
		t.Fatalf("handler runs %d, step runs %d; want the takeover run, the step not run again", app.executions.Load(), app.charges.Load())
	}
	wantProblem(t, s.do(t, base, charge), http.StatusConflict, "operation-uncertain")
	if app.executions.Load() != 2 {
		t.Fatalf("handler runs = %d after a retry of an uncertain key, want 2", app.executions.Load())
	}
}

// RecoverOne runs rec's passes ([idem.Recoverer.RecoverOnce]) until one
// record was recovered, and returns their sum; it fails t when a pass
// fails, a run is deferred, or nothing is recovered within 20s (a lease
// of a few seconds lapses long before).
func RecoverOne(t *testing.T, rec *idem.Recoverer) idem.RecoveryReport {
	t.Helper()
	var sum idem.RecoveryReport
	for deadline := time.Now().Add(2 * time.Minute); sum.Recovered == 0; time.Sleep(100 * time.Millisecond) {
		rep, err := rec.RecoverOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		sum.Due += rep.Due
		sum.Claimed += rep.Claimed
		sum.Recovered += rep.Recovered
		sum.Deferred += rep.Deferred
		sum.Uncertain += rep.Uncertain
		if sum.Deferred > 0 || time.Now().After(deadline) {
			t.Fatalf("recovery passes: %+v; want one record recovered within 2 minutes, no run deferred", sum)
		}
	}
	return sum
}
