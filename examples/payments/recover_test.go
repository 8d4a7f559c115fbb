package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/examples/internal/payments"
	"github.com/idemkit/idem/examples/internal/procs"
)

var soak = flag.Bool("soak", false, "play the long runs: TestRecoverWithoutClients with 500 payments per store (make soak)")

var historySize = flag.Int("history", 0, "TestRecoverWithoutClients: completed recoverable records written to each store but the MongoDB wire before its payments (FerretDB's SQLite backend scans the collection on every lookup: a history there slows every call, not recovery)")

// recoverEvery is the recoverers' interval in these tests (-recover-every).
const recoverEvery = 250 * time.Millisecond

// recoverWait bounds how long the tests wait for recoverers to finish what
// crashed: far beyond lease + interval + handler time, for a loaded machine
// (make test-under-load: FerretDB's calls time out there, and a run that
// failed waits its backoff, 1 s doubling, before its next claim).
const recoverWait = 8 * time.Minute

// inflight is one payment sent to an instance that was then SIGKILLed.
type inflight struct {
	user, key string
	amount    int64
	point     string // the pause point the instance was killed at
	route     string // the engine's route of the call, "" for POST /v1/payments
	// disturbed: a try before it was held failed 5xx (a loaded store timed
	// out under the handler), so it ran part of its handler twice.
	disturbed bool
}

// scopedKey is the payment's record key in the store.
func (p inflight) scopedKey() string {
	route := p.route
	if route == "" {
		route = "/v1/payments"
	}
	return idem.ScopedKey(p.user, "POST", route, p.key)
}

// TestRecoverWithoutClients runs, on every shared store (Redis, MongoDB
// wire, PostgreSQL, MySQL), 50 payments (500 with -soak) across two
// instances held at every pause point (each instance cycles through
// payments.PausePoints in its own order), SIGKILLs both and restarts one,
// and sends no retry: with -recover the recoverer finishes every payment
// (the provider charged once each, one ledger row each, a receipt once,
// or the record parked uncertain where the crash cut the receipt step),
// and each client's late retry then gets the stored answer replayed. The
// control, the same crash without -recover, leaves every payment in
// progress after the lease and many recovery intervals.
func TestRecoverWithoutClients(t *testing.T) {
	t.Parallel() // each mostly waits for leases to lapse, on its own provider, schema and prefix
	n := 50
	if *soak {
		n = 500
	}
	bin, provider := buildCrashBinaries(t)
	var wg sync.WaitGroup
	for _, store := range []string{"redis", "mongo", "postgres", "mysql"} {
		wg.Go(func() {
			t.Run(store, func(t *testing.T) {
				env := newCrashEnv(t, store, bin, provider)
				st, closeStore, err := payments.OpenStore(env.cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer closeStore()
				if h := *historySize; h > 0 && store != "mongo" {
					start := time.Now()
					if err := storetest.WriteHistory(context.Background(), st, h); err != nil {
						t.Fatal(err)
					}
					t.Logf("%s: %d completed recoverable records written in %v", store, h, time.Since(start).Round(time.Second))
				}
				in := st.(idem.Inspector)
				env.recoverWave(t, in, n)
				env.controlWave(t, in, 14)
			})
		})
	}
	wg.Wait()
}

// rotatedPoints are payments.PausePoints in another order: the second
// instance's points, so that the two are killed at different points.
var rotatedPoints = append(slices.Clone(payments.PausePoints[3:]), payments.PausePoints[:3]...)

// recoverFlags are the flags of an instance with a recoverer.
var recoverFlags = append(slices.Clone(quickRecoverFlags), loadedFlags...)

// quickRecoverFlags are the flags of an instance with a recoverer and the
// crash tests' short lease (2s), for tests with a payment or two.
var quickRecoverFlags = []string{"-recover", "-recover-every", recoverEvery.String()}

// loadedFlags let 50 payments at once run on a loaded machine without
// their leases lapsing while they are held (each store call bounded by 2s, a fifth of the lease: a FerretDB under load fails renewals).
var loadedFlags = []string{"-store-timeout", "2s", "-lease", "10s"}

// crashWave sends n payments across two instances started with extra
// flags, each holding its payments at the pause points (A cycling through
// pointsA, B through pointsB), SIGKILLs both once every payment is held,
// and returns the payments.
func (env *crashEnv) crashWave(t *testing.T, n int, extra []string, pointsA, pointsB []string) []inflight {
	t.Helper()
	a := env.start(t, append(slices.Clone(extra), "-pause-at", strings.Join(pointsA, ","))...)
	b := env.start(t, append(slices.Clone(extra), "-pause-at", strings.Join(pointsB, ","))...)
	run := "rec-" + strings.ToLower(rand.Text()[:8])
	sent := make([]inflight, n)
	for i := range sent {
		sent[i] = inflight{user: fmt.Sprintf("%s-%d", run, i), key: rand.Text(), amount: int64(1000 + i)}
	}
	var wg sync.WaitGroup
	ended := make(chan string) // payments answered before they were held
	done := make(chan struct{})
	next := 0
	startNext := func() { // payment next, to A or B in turn
		p, i := a, next
		if i%2 == 1 {
			p = b
		}
		next++
		wg.Go(func() {
			var final bool
			sent[i].disturbed, final = hold(p.URL, sent[i])
			if final {
				select {
				case ended <- sent[i].user:
				case <-done:
				}
			}
		})
	}
	points := map[string]string{} // user -> point
	held := make(chan [2]string)
	endedEarly := map[string]bool{}
	for _, p := range []*procs.Proc{a, b} {
		go func() { // until the process exits
			for {
				l, err := p.Line("paused at ")
				if err != nil {
					return
				}
				var point, user string
				if _, err := fmt.Sscanf(l, "paused at %s %s", &point, &user); err != nil {
					continue
				}
				select {
				case held <- [2]string{user, point}:
				case <-done:
					return
				}
			}
		}()
	}
	// At most holdWindow payments on their way to their point at once (a
	// loaded FerretDB times out under 50 acquires at once); all n are held
	// at once when the instances are killed.
	const holdWindow = 8
	for next < min(n, holdWindow) {
		startNext()
	}
	limit := recoverWait * time.Duration(max(1, n/50)) // -soak: 500 payments
	timeout := time.After(limit)
	for len(points)+len(endedEarly) < n {
		select {
		case u := <-ended:
			if _, ok := points[u]; !ok && !endedEarly[u] {
				endedEarly[u] = true
				if next < n {
					startNext()
				}
			}
		case h := <-held:
			if _, again := points[h[0]]; !again && next < n {
				startNext()
			}
			points[h[0]] = h[1] // a payment held again (its lease lapsed, the peer's recoverer took it) is held at its latest point
		case <-timeout:
			close(done)
			a.Kill()
			b.Kill()
			wg.Wait()
			t.Fatalf("%d of %d payments held after %v", len(points), n, limit)
		}
	}
	close(done)
	a.Kill()
	b.Kill()
	wg.Wait()
	for i := range sent {
		sent[i].point = points[sent[i].user]
		if sent[i].point == "" && !endedEarly[sent[i].user] {
			t.Fatalf("payment of %s was not held at a point", sent[i].user)
		}
	}
	return sent
}

// hold sends p until the instance is killed under it (no answer): it
// retries whatever a loaded store makes the service answer before the
// handler is held (503 store-unavailable, 409 in-progress after an
// acquire that timed out, a 5xx of a step whose journal write timed out),
// so that every payment reaches its pause point. Once held, nothing
// retries. It reports whether a try failed 5xx, and whether the payment
// got a final answer instead of being held (then it counts as disturbed).
func hold(base string, p inflight) (disturbed, final bool) {
	wait := 100 * time.Millisecond
	for {
		status, h, _ := send(base, p.user, p.key, p.amount)
		switch {
		case status == 0:
			return disturbed, false
		case status < 500 && (status != http.StatusConflict || h.Get("Retry-After") == ""):
			// answered before it was held: a loaded store lost its lease
			// and another run finished it (uncertain, or completed)
			return true, true
		}
		disturbed = disturbed || status >= 500
		time.Sleep(wait/2 + mrand.N(wait)) //nolint:gosec // jitter, not a secret
		wait = min(2*wait, 2*time.Second)
	}
}

// sendSettled sends p until it is not answered 409 in-progress (60s at
// most): an execution whose completion write timed out answered its
// client and retries the write in the background; until it lands, the
// record is in progress.
func sendSettled(base string, p inflight) (int, http.Header, []byte) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		status, h, body := send(base, p.user, p.key, p.amount)
		if status != http.StatusConflict || h.Get("Retry-After") == "" || time.Now().After(deadline) {
			return status, h, body
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// recoverWave is TestRecoverWithoutClients on env with n payments.
func (env *crashEnv) recoverWave(t *testing.T, in idem.Inspector, n int) {
	before := env.stats(t)
	sent := env.crashWave(t, n, recoverFlags, payments.PausePoints, rotatedPoints)
	c := env.start(t, recoverFlags...) // one instance restarted; no client comes back
	defer c.Stop()
	restarted := time.Now()
	states := env.waitStates(t, in, sent, recoverWait*time.Duration(max(1, n/50)))
	t.Logf("%d payments settled %v after the restart (lease 10s, recovery interval %v)", n, time.Since(restarted).Round(time.Millisecond), recoverEvery)
	wantEmails, disturbed := int64(0), int64(0)
	for _, p := range sent {
		if p.disturbed {
			disturbed++
		}
	}
	// A run whose journal write failed (the store timed out, as it does
	// on a loaded machine when some payments failed 5xx) ends uncertain,
	// the honest answer: parked, never run twice. Up to a quarter of the
	// payments may end so then, in place of completed.
	parked, finished, mayPark := map[string]bool{}, map[string]bool{}, 0
	if disturbed > 0 {
		mayPark = n / 4
	}
	for _, p := range sent {
		if p.point == "" { // answered before it was held: completed or uncertain (waitStates), effects bounded below
			continue
		}
		want := crashOutcomes[p.point]
		wantEmails += want.emails
		wantState := idem.StateCompleted
		if want.status == http.StatusConflict {
			wantState = idem.StateUncertain
		}
		if states[p.key] == idem.StateUncertain && wantState == idem.StateCompleted && len(parked)+len(finished) < mayPark {
			parked[p.key] = true
			wantState = idem.StateUncertain
			wantEmails -= want.emails // it may or may not have mailed: bounded below
		}
		if states[p.key] == idem.StateCompleted && wantState == idem.StateUncertain && len(parked)+len(finished) < mayPark {
			// its try failed on the store before it reached its crash
			// point, and a later run completed it (mailing once)
			finished[p.key] = true
			wantState = idem.StateCompleted
		}
		if states[p.key] != wantState {
			t.Errorf("%s cut at %s: %v, want %v", p.user, p.point, states[p.key], wantState)
		}
		if env.rows != nil {
			wantRows := int64(0)
			if wantState == idem.StateCompleted {
				wantRows = 1
			}
			if rows := env.rows(t, p.user); rows != wantRows {
				t.Errorf("%s cut at %s: %d ledger rows, want %d", p.user, p.point, rows, wantRows)
			}
		}
	}
	after := env.stats(t)
	if got := after.Charges - before.Charges; got != int64(n) {
		t.Errorf("provider: %d charges, want %d (one per payment)", got, n)
	}
	// A payment whose try failed 5xx before it was held (the store timed
	// out under its handler) may have mailed in that try too.
	if len(parked) > 0 {
		t.Logf("%d payments parked uncertain after a journal write failed (the store timed out)", len(parked))
	}
	if got := after.Emails - before.Emails; got < wantEmails || got > wantEmails+disturbed+int64(len(parked)+len(finished)) {
		t.Errorf("provider: %d receipts, want %d (one per payment but where the crash came before the mail; up to %d more for payments whose earlier try failed 5xx)", got, wantEmails, disturbed)
	}
	if disturbed > 0 {
		t.Logf("%d payments failed 5xx before they were held (the store timed out)", disturbed)
	}
	for _, p := range sent { // the clients' late retries
		if p.point == "" {
			continue
		}
		status, h, body := sendSettled(c.URL, p)
		want := crashOutcomes[p.point].status
		if parked[p.key] {
			want = http.StatusConflict
		}
		if finished[p.key] {
			want = http.StatusCreated
		}
		switch {
		case want == http.StatusCreated && (status != want || h.Get(idem.ReplayedHeader) != "true"):
			t.Errorf("%s cut at %s: the late retry got %d %s (replayed %q), want the payment replayed", p.user, p.point, status, body, h.Get(idem.ReplayedHeader))
		case want == http.StatusConflict && (status != want || !strings.Contains(string(body), "operation-uncertain")):
			t.Errorf("%s cut at %s: the late retry got %d %s, want 409 operation-uncertain", p.user, p.point, status, body)
		}
	}
}

// controlWave crashes n payments as recoverWave does, without -recover:
// after the lease and 20 recovery intervals no payment has completed.
func (env *crashEnv) controlWave(t *testing.T, in idem.Inspector, n int) {
	sent := env.crashWave(t, n, loadedFlags, payments.PausePoints, rotatedPoints)
	c := env.start(t, loadedFlags...)
	defer c.Stop()
	time.Sleep(10*time.Second + 20*recoverEvery) // -lease 10s
	for _, p := range sent {
		info, found, err := in.Inspect(context.Background(), p.scopedKey())
		if err != nil {
			t.Fatal(err)
		}
		if found && info.State != idem.StateInProgress {
			t.Errorf("control: %s cut at %s is %v without a recoverer or a client, want in progress", p.user, p.point, info.State)
		}
	}
}

// waitStates polls the records of sent until none is in progress, for at
// most limit, and returns each one's state by idempotency key. When some
// are still in progress then, it fails with what the store holds for each
// (see describeRecord), so that a failure says why.
func (env *crashEnv) waitStates(t *testing.T, in idem.Inspector, sent []inflight, limit time.Duration) map[string]idem.State {
	t.Helper()
	deadline := time.Now().Add(limit)
	states := map[string]idem.State{}
	for {
		var pending []inflight
		for _, p := range sent {
			if s := states[p.key]; s == idem.StateCompleted || s == idem.StateUncertain {
				continue
			}
			info, found, err := in.Inspect(context.Background(), p.scopedKey())
			if err != nil {
				t.Fatal(err)
			}
			if !found {
				t.Fatalf("%s cut at %s: no record", p.user, p.point)
			}
			states[p.key] = info.State
			if info.State == idem.StateInProgress {
				pending = append(pending, p)
			}
		}
		if len(pending) == 0 {
			return states
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, p := range pending {
				fmt.Fprintf(&b, "\n%s cut at %q (disturbed %v), key %.16s: %s", p.user, p.point, p.disturbed, p.scopedKey(), env.describeRecord(t, in, p.scopedKey()))
			}
			t.Fatalf("%d of %d payments still in progress after %v:%s", len(pending), len(sent), limit, b.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// describeRecord says what the store holds for the scoped key: the
// record (state, owner token, TTL), its journal, whether the store's
// Lapsed reports it due (and its recovery attempts), and, on MongoDB,
// the document's recovery fields and the claims on its versions. For a
// failure message; errors are part of the answer.
func (env *crashEnv) describeRecord(t *testing.T, in idem.Inspector, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	info, found, err := in.Inspect(ctx, key)
	fmt.Fprintf(&b, "record (found %v, err %v): state %v, token %q, TTL %v", found, err, info.State, info.Token, info.TTL)
	if j, ok := in.(idem.Journal); ok {
		steps, err := j.Steps(ctx, key)
		fmt.Fprintf(&b, "; steps")
		for _, s := range steps {
			fmt.Fprintf(&b, " %s(token %q, done %v)", s.Name, s.Token, s.Done)
		}
		if err != nil {
			fmt.Fprintf(&b, " (err %v)", err)
		}
	}
	if r, ok := in.(idem.Recoverable); ok {
		due, err := r.Lapsed(ctx, 1000)
		i := slices.IndexFunc(due, func(d idem.LapsedRecord) bool { return d.Key == key })
		switch {
		case err != nil:
			fmt.Fprintf(&b, "; Lapsed: %v", err)
		case i >= 0:
			fmt.Fprintf(&b, "; due for recovery (%d attempts)", due[i].Attempts)
		default:
			fmt.Fprintf(&b, "; not due for recovery (Lapsed answered %d other records)", len(due))
		}
	}
	if env.cfg.Store == "mongo" {
		b.WriteString("; " + mongoRecord(ctx, env.cfg, key))
	}
	return b.String()
}

// mongoRecord returns the fields of key's MongoDB document that decide
// its recovery (stores/mongostore: state 1 in progress, its owner's token
// and generation, lease end, expiry, the recovery payload's size,
// attempts, backoff and dueAt) and the claims on its versions (documents
// "<key>~<generation>": state 3 takeover, 4 deletion; the generation they
// grant, the lease).
func mongoRecord(ctx context.Context, cfg payments.Config, key string) string {
	client, err := mongo.Connect(options.Client().ApplyURI(cfg.MongoURI))
	if err != nil {
		return "mongo: " + err.Error()
	}
	defer func() { _ = client.Disconnect(ctx) }()
	db, name := cfg.MongoDB, cfg.MongoColl
	if db == "" {
		db = "idem"
	}
	if name == "" {
		name = "idempotency"
	}
	coll := client.Database(db).Collection(name)
	var d struct {
		State     int32         `bson:"state"`
		Token     string        `bson:"token"`
		Gen       string        `bson:"gen"`
		ExpiresAt bson.DateTime `bson:"expiresAt"`
		Until     bson.DateTime `bson:"until"`
		DueAt     bson.DateTime `bson:"dueAt"`
		Recovery  []byte        `bson:"recovery"`
		Attempts  int32         `bson:"attempts"`
		Backoff   int64         `bson:"backoff"`
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&d); err != nil {
		return "document: " + err.Error()
	}
	at := func(v bson.DateTime) string {
		if v == 0 {
			return "-"
		}
		return v.Time().UTC().Format("15:04:05.000")
	}
	out := fmt.Sprintf("document: state %d, token %q, gen %q, until %s, expiresAt %s, payload %d bytes, attempts %d, backoff %dms, dueAt %s (now %s)",
		d.State, d.Token, d.Gen, at(d.Until), at(d.ExpiresAt), len(d.Recovery), d.Attempts, d.Backoff, at(d.DueAt), time.Now().UTC().Format("15:04:05.000"))
	cur, err := coll.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$regex", Value: "^" + key + "~"}}}})
	if err != nil {
		return out + "; claims: " + err.Error()
	}
	var claims []struct {
		ID    string        `bson:"_id"`
		State int32         `bson:"state"`
		Token string        `bson:"token"`
		Gen   string        `bson:"gen"`
		Lease bson.DateTime `bson:"lease"`
	}
	if err := cur.All(ctx, &claims); err != nil {
		return out + "; claims: " + err.Error()
	}
	out += fmt.Sprintf("; %d claims", len(claims))
	for _, c := range claims {
		out += fmt.Sprintf(" [ends %s: state %d, token %q, grants gen %q, lease %s]", strings.TrimPrefix(c.ID, key+"~"), c.State, c.Token, c.Gen, at(c.Lease))
	}
	return out
}

// TestRecoverRaces crashes 10 payments inside their charge step on every
// shared store (the provider taking 300ms a charge), then starts three
// instances with recoverers while every client retries through them at
// once: each record runs once at a time (the provider never sees two
// charge calls under one key at once), each payment is charged once, and
// every client gets the same payment.
func TestRecoverRaces(t *testing.T) {
	t.Parallel() // each mostly waits for leases to lapse, on its own provider, schema and prefix
	const n = 10
	bin, provider := buildCrashBinaries(t)
	var wg sync.WaitGroup
	for _, store := range []string{"redis", "mongo", "postgres", "mysql"} {
		wg.Go(func() {
			t.Run(store, func(t *testing.T) {
				env := newCrashEnv(t, store, bin, provider, "-latency", "300ms")
				before := env.stats(t)
				cut := []string{"charge-after-call"}
				sent := env.crashWave(t, n, recoverFlags, cut, cut)
				var live []*procs.Proc
				for range 3 {
					p := env.start(t, recoverFlags...)
					defer p.Stop()
					live = append(live, p)
				}
				answers := make([]string, n)
				var clients sync.WaitGroup
				for i, p := range sent {
					clients.Go(func() {
						status, body := retry(t, live[i%3].URL, p.user, p.key, p.amount)
						if status != http.StatusCreated {
							t.Errorf("%s: %d %s, want 201", p.user, status, body)
						}
						answers[i] = string(body)
					})
				}
				clients.Wait()
				after := env.stats(t)
				if got := after.Conflicts - before.Conflicts; got != 0 {
					t.Errorf("provider: %d charge calls came while another under the key ran: a record ran twice at once", got)
				}
				if got := after.Charges - before.Charges; got != n {
					t.Errorf("provider: %d charges, want %d", got, n)
				}
				t.Logf("%d keyed charge calls for %d payments (one before the crash, one per run after)", after.KeyedCalls-before.KeyedCalls, n)
				for i, p := range sent {
					for _, l := range live {
						status, h, body := sendSettled(l.URL, p)
						if status != http.StatusCreated || h.Get(idem.ReplayedHeader) != "true" || string(body) != answers[i] {
							t.Errorf("%s: %d %s (replayed %q), want %s replayed", p.user, status, body, h.Get(idem.ReplayedHeader), answers[i])
						}
					}
					if env.rows != nil {
						if rows := env.rows(t, p.user); rows != 1 {
							t.Errorf("%s: %d ledger rows, want 1", p.user, rows)
						}
					}
				}
			})
		})
	}
	wg.Wait()
}

// TestRecoverParks runs, on Redis and PostgreSQL, a payment whose handler
// always kills its process (-crash-at charge-after-call), restarting the
// instance (with -recover-attempts 2) each time it dies and sending no
// retry: after the client's run and two recovery runs the record is
// parked uncertain, listed as such by the store's Lister, counted in the
// instance's metrics (recovery-parked), charged once, and the client's
// late retry gets 409 operation-uncertain.
func TestRecoverParks(t *testing.T) {
	t.Parallel() // each mostly waits for leases to lapse, on its own provider, schema and prefix
	bin, provider := buildCrashBinaries(t)
	var wg sync.WaitGroup
	for _, store := range []string{"redis", "postgres"} {
		wg.Go(func() {
			t.Run(store, func(t *testing.T) {
				env := newCrashEnv(t, store, bin, provider)
				st, closeStore, err := payments.OpenStore(env.cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer closeStore()
				before := env.stats(t)
				flags := append(slices.Clone(quickRecoverFlags), "-recover-attempts", "2", "-crash-at", "charge-after-call")
				p := inflight{user: "park-" + strings.ToLower(rand.Text()[:8]), key: rand.Text(), amount: amount}
				var inst *procs.Proc
				var exited chan struct{}
				start := func() {
					inst, exited = env.start(t, flags...), make(chan struct{})
					go func(p *procs.Proc, exited chan struct{}) { _ = p.Exit(); close(exited) }(inst, exited)
				}
				start()
				_, _, _ = send(inst.URL, p.user, p.key, p.amount) // the instance dies under it
				crashes := 0
				deadline := time.Now().Add(recoverWait)
				for {
					info, found, err := st.(idem.Inspector).Inspect(context.Background(), p.scopedKey())
					if err != nil {
						t.Fatal(err)
					}
					if found && info.State == idem.StateUncertain {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("not parked after %v and %d crashes: %+v (found %v)", recoverWait, crashes, info, found)
					}
					select {
					case <-exited: // a run crashed it: restart it
						crashes++
						start()
					case <-time.After(200 * time.Millisecond):
					}
				}
				defer inst.Stop()
				if crashes < 1 || crashes > 3 {
					t.Errorf("%d crashes, want the client's run and at most 2 recovery runs", crashes)
				}
				page, err := st.(idem.Lister).List(context.Background(), idem.ListQuery{KeyPrefix: p.scopedKey()[:16], State: idem.StateUncertain, Limit: 10})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.ContainsFunc(page.Records, func(r idem.ListedRecord) bool { return r.Key == p.scopedKey() }) {
					t.Errorf("the store's Lister does not list the parked record as uncertain: %+v", page.Records)
				}
				if got := env.stats(t).Charges - before.Charges; got != 1 {
					t.Errorf("provider: %d charges, want 1", got)
				}
				if !metricSeen(t, inst.URL, `idem_outcome="recovery-parked"`) {
					t.Errorf("the instance that parked the record has no recovery-parked metric")
				}
				status, _, body := send(inst.URL, p.user, p.key, p.amount)
				if status != http.StatusConflict || !strings.Contains(string(body), "operation-uncertain") {
					t.Errorf("the late retry got %d %s, want 409 operation-uncertain", status, body)
				}
			})
		})
	}
	wg.Wait()
}

// TestRecoverFrameworks checks -recover's wiring on every HTTP framework
// (Redis): two payments held in their charge step and after their steps,
// both instances SIGKILLed, one restarted, no retry: the recoverer's runs
// pass the framework's authentication (the stored principal, through
// Engine.RecoveryPrincipal) and complete both, which the late retries
// get replayed.
func TestRecoverFrameworks(t *testing.T) {
	t.Parallel() // each mostly waits for leases to lapse, on its own provider, schema and prefix
	bin, provider := buildCrashBinaries(t)
	var wg sync.WaitGroup
	for _, fw := range procs.Frameworks {
		wg.Go(func() {
			t.Run(fw, func(t *testing.T) {
				env := newCrashEnv(t, "redis", bin, provider)
				st, closeStore, err := payments.OpenStore(env.cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer closeStore()
				flags := append(slices.Clone(quickRecoverFlags), "-framework", fw)
				sent := env.crashWave(t, 2, flags, []string{"charge-after-call"}, []string{"after-steps"})
				c := env.start(t, flags...)
				defer c.Stop()
				states := env.waitStates(t, st.(idem.Inspector), sent, recoverWait)
				for _, p := range sent {
					if states[p.key] != idem.StateCompleted {
						t.Errorf("%s cut at %s: %v, want completed", p.user, p.point, states[p.key])
					}
					status, h, body := send(c.URL, p.user, p.key, p.amount)
					if status != http.StatusCreated || h.Get(idem.ReplayedHeader) != "true" {
						t.Errorf("%s cut at %s: the late retry got %d %s (replayed %q), want the payment replayed", p.user, p.point, status, body, h.Get(idem.ReplayedHeader))
					}
				}
			})
		})
	}
	wg.Wait()
}

// TestRecoverWithoutClient SIGKILLs the payments service (-provider-url,
// lease 2s; on FerretDB 8s with 2s store calls, in a collection of its
// own) mid-payment and restarts it, on every shared store, and no
// client retries: with -recover the restarted instance's recoverer
// finishes the payment on its own (a crash after the charge: one charge,
// one receipt, one ledger row on the SQL stores, and the client's late
// retry gets the payment replayed) or parks it uncertain (a crash inside
// the receipt step: one charge, no row, the late retry gets 409
// operation-uncertain). The control, without -recover, leaves the
// payment incomplete (no row) until the client's retry takes it over and
// runs it (not a replay).
func TestRecoverWithoutClient(t *testing.T) {
	bin, provider := buildCrashBinaries(t)
	var wg sync.WaitGroup // all stores at once: each mostly waits for a lease to lapse
	for _, store := range []string{"redis", "mongo", "postgres", "mysql"} {
		wg.Go(func() {
			t.Run(store, func(t *testing.T) {
				env := newCrashEnv(t, store, bin, provider)
				for _, c := range []struct {
					point   string
					recover bool
					want    crashOutcome
				}{
					{"charge-after-call", true, crashOutcome{http.StatusCreated, 1, 1}},
					{"receipt-before-call", true, crashOutcome{http.StatusConflict, 1, 0}},
					{"charge-after-call", false, crashOutcome{http.StatusCreated, 1, 1}},
				} {
					got, rows, replayed := env.crashUnattended(t, c.point, c.recover)
					if got != c.want || replayed != (c.recover && c.want.status == http.StatusCreated) {
						t.Errorf("%s, recover %v: %+v, replayed %v; want %+v, replayed %v", c.point, c.recover, got, replayed, c.want, c.recover && c.want.status == http.StatusCreated)
					}
					if env.rows != nil && rows != c.want.charges*boolInt(c.want.status == http.StatusCreated) {
						t.Errorf("%s, recover %v: %d ledger rows", c.point, c.recover, rows)
					}
				}
			})
		})
	}
	wg.Wait()
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// crashUnattended sends one payment to an instance held at point,
// SIGKILLs it there and restarts the service (with recovery or not), with
// no client retry: with recovery it waits for the recoverer's answer
// (its metrics count a recovered or an uncertain execution); without,
// for two leases, and checks the ledger has no row. Then the client's late
// retry gets the final answer. It returns that answer, the provider's new
// charges and receipts, the ledger rows, and whether the late retry was a
// replay.
func (env *crashEnv) crashUnattended(t *testing.T, point string, recover bool) (crashOutcome, int64, bool) {
	t.Helper()
	var extra []string
	if recover {
		extra = quickRecoverFlags
	}
	if slices.Contains(env.args, "mongo") { // a collection of its own (no other test's records to recover), and FerretDB's slower calls
		extra = append(slices.Clip(extra), "-mongo-collection", "recover_"+strings.ToLower(rand.Text()[:10]), "-store-timeout", "2s", "-lease", "8s")
	}
	before := env.stats(t)
	user, key := "unattended-"+rand.Text()[:8], rand.Text()
	a := env.start(t, append([]string{"-pause-at", point}, extra...)...)
	sent := make(chan struct{})
	go func() { defer close(sent); _, _, _ = send(a.URL, user, key, amount) }() // cut by the SIGKILL
	if _, err := a.Line("paused at " + point); err != nil {
		t.Fatalf("%s: %v", point, err)
	}
	a.Kill()
	<-sent
	b := env.start(t, extra...)
	defer b.Stop()
	if recover {
		for deadline := time.Now().Add(60 * time.Second); !metricSeen(t, b.URL, `idem_outcome="recovered"`) && !metricSeen(t, b.URL, `idem_outcome="uncertain"`); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the recoverer finished nothing in 60s", point)
			}
		}
	} else {
		time.Sleep(4 * time.Second) // two leases: nothing happens without a client
		if metricSeen(t, b.URL, `idem_outcome="recovered"`) {
			t.Fatalf("%s: recovered without -recover", point)
		}
	}
	if env.rows != nil && !recover {
		if n := env.rows(t, user); n != 0 {
			t.Fatalf("%s without -recover: %d ledger rows before the client came back, want 0", point, n)
		}
	}
	status, h, body := send(b.URL, user, key, amount)
	if status == http.StatusConflict && h.Get("Retry-After") != "" { // without -recover: the lapsed lease is taken over by a retry
		status, body = retry(t, b.URL, user, key, amount)
		h = http.Header{}
	}
	if status == http.StatusConflict && !strings.Contains(string(body), "operation-uncertain") {
		t.Errorf("%s: 409 %s, want operation-uncertain", point, body)
	}
	after := env.stats(t)
	var rows int64
	if env.rows != nil {
		rows = env.rows(t, user)
	}
	return crashOutcome{status, after.Charges - before.Charges, after.Emails - before.Emails}, rows, h.Get(idem.ReplayedHeader) == "true"
}

// metricSeen reports whether the instance's GET /metrics has a line
// containing s.
func metricSeen(t *testing.T, base, s string) bool {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), s)
}
