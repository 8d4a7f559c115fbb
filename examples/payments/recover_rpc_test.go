package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/adapters/idemgrpc"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/grpc/gen/paymentsv1"
	"github.com/idemkit/idem/examples/grpc/gen/paymentsv1/paymentsv1connect"
	"github.com/idemkit/idem/examples/internal/payments"
	"github.com/idemkit/idem/examples/internal/procs"
)

// rpcDoor is a door of CreatePayment: grpc-go (recovered through
// idemgrpc.Runner, the in-memory listener to the same grpc.Server), or
// Connect's own protocol at the instance's URL (recovered through
// idemconnect.Runner, the Connect handler).
type rpcDoor struct {
	name  string
	flags []string
}

var rpcDoors = []rpcDoor{
	{"grpc", []string{"-framework", "grpc", "-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0"}},
	{"connect", []string{"-framework", "grpc", "-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0", "-recover-connect"}},
}

// rpcAnswer is what a CreatePayment call got.
type rpcAnswer struct {
	code     codes.Code
	id       string // the payment's id, when OK
	replayed bool
	msg      string
	err      error // the call's, nil when OK
}

// rpcSend makes one CreatePayment call of p through door to proc, with
// the extra metadata (name, value pairs); code Unavailable when no answer
// came (the instance was killed under it).
func rpcSend(door string, proc *procs.Proc, p inflight, extra ...string) rpcAnswer {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req := &paymentsv1.CreatePaymentRequest{Amount: p.amount, Currency: "eur"}
	if door == "connect" {
		creq := connect.NewRequest(req)
		creq.Header().Set("X-User-Id", p.user)
		creq.Header().Set("Idempotency-Key", p.key)
		for i := 0; i+1 < len(extra); i += 2 {
			creq.Header().Set(extra[i], extra[i+1])
		}
		res, err := paymentsv1connect.NewPaymentsClient(http.DefaultClient, proc.URL).CreatePayment(ctx, creq)
		if err == nil {
			return rpcAnswer{code: codes.OK, id: res.Msg.GetId(), replayed: res.Header().Get(idem.ReplayedHeader) == "true"}
		}
		var ce *connect.Error
		if !errors.As(err, &ce) {
			return rpcAnswer{code: codes.Unavailable, err: err}
		}
		return rpcAnswer{code: codes.Code(ce.Code()), msg: ce.Message(), replayed: ce.Meta().Get(idem.ReplayedHeader) == "true", err: err}
	}
	conn, err := grpc.NewClient("passthrough:///"+proc.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return rpcAnswer{code: codes.Unavailable, err: err}
	}
	defer conn.Close()
	ctx = metadata.AppendToOutgoingContext(ctx, append([]string{"x-user-id", p.user, "idempotency-key", p.key}, extra...)...)
	var header metadata.MD
	res, err := paymentsv1.NewPaymentsClient(conn).CreatePayment(ctx, req, grpc.Header(&header))
	return rpcAnswer{code: status.Code(err), id: res.GetId(), replayed: len(header.Get(idemgrpc.ReplayedMetadata)) > 0, msg: status.Convert(err).Message(), err: err}
}

// rpcHold sends p until the instance is killed under it (done is closed
// before the kill), as hold does: what a loaded store makes the service
// answer before the handler is held (Unavailable, Aborted in progress,
// Internal) is retried; once held, nothing retries. It reports whether a
// try failed other than Aborted, and whether the payment got a final
// answer instead of being held.
func rpcHold(door string, proc *procs.Proc, p inflight, done chan struct{}) (disturbed, final bool) {
	wait := 100 * time.Millisecond
	for {
		a := rpcSend(door, proc, p)
		select {
		case <-done: // every payment was held or answered: this one was cut by the kill
			return disturbed, false
		default:
		}
		if a.code != codes.Unavailable && a.code != codes.Aborted && a.code != codes.Internal {
			return true, true
		}
		disturbed = disturbed || a.code != codes.Aborted
		time.Sleep(wait/2 + mrand.N(wait)) //nolint:gosec // jitter, not a secret
		wait = min(2*wait, 2*time.Second)
	}
}

// rpcSettled sends p until it is not answered Aborted in progress (4
// minutes at most).
func rpcSettled(door string, proc *procs.Proc, p inflight) rpcAnswer {
	deadline := time.Now().Add(4 * time.Minute)
	for {
		a := rpcSend(door, proc, p)
		if a.code != codes.Aborted || time.Now().After(deadline) {
			return a
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rpcWave sends n payments through door across two instances started
// with flags, each holding its payments at its pause points (A cycling
// through pointsA, B through pointsB, in the order the payments reach
// them), and SIGKILLs both once every payment is held (or answered, on a
// loaded store); it returns the payments, each with the point it was
// held at ("" when answered).
func (env *crashEnv) rpcWave(t *testing.T, door rpcDoor, n int, flags, pointsA, pointsB []string) []inflight {
	t.Helper()
	flags = append(slices.Clone(door.flags), flags...)
	a := env.start(t, append(slices.Clone(flags), "-pause-at", strings.Join(pointsA, ","))...)
	b := env.start(t, append(slices.Clone(flags), "-pause-at", strings.Join(pointsB, ","))...)
	run := door.name + "-" + strings.ToLower(rand.Text()[:8])
	sent := make([]inflight, n)
	for i := range sent {
		sent[i] = inflight{user: fmt.Sprintf("%s-%d", run, i), key: rand.Text(), amount: int64(1000 + i), route: createPaymentProcedure}
	}
	held := make(chan [2]string)
	ended := make(chan int)
	done := make(chan struct{})
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
	var wg sync.WaitGroup
	for i := range sent {
		p := a
		if i%2 == 1 {
			p = b
		}
		wg.Go(func() {
			var final bool
			sent[i].disturbed, final = rpcHold(door.name, p, sent[i], done)
			if final {
				select {
				case ended <- i:
				case <-done:
				}
			}
		})
	}
	points, answered := map[string]string{}, map[int]bool{}
	timeout := time.After(recoverWait)
	for len(points)+len(answered) < n {
		select {
		case h := <-held:
			points[h[0]] = h[1] // held again (a peer's recoverer took it over): its latest point
		case i := <-ended:
			if _, ok := points[sent[i].user]; !ok {
				answered[i] = true
			}
		case <-timeout:
			close(done)
			a.Kill()
			b.Kill()
			wg.Wait()
			t.Fatalf("%d of %d calls held, %d answered after %v", len(points), n, len(answered), recoverWait)
		}
	}
	close(done)
	a.Kill()
	b.Kill()
	wg.Wait()
	for i := range sent {
		if !answered[i] {
			sent[i].point = points[sent[i].user]
		}
	}
	return sent
}

// createPaymentProcedure is CreatePayment's route in the engine.
const createPaymentProcedure = paymentsv1connect.PaymentsCreatePaymentProcedure

// TestRecoverRPC crashes CreatePayment calls on grpc-go and on Connect,
// on Redis and PostgreSQL: 8 calls held across two instances before,
// inside (before and after the provider's answer) and after the charge
// step (repeatable), inside the receipt step (not repeatable: before and
// after the mail), after the steps and before completion; both instances
// SIGKILLed, one restarted with a recoverer, no client retrying. Each
// call ends completed once (one charge, one ledger row on PostgreSQL) or,
// cut inside the receipt step, parked uncertain; the late retries get the
// payment replayed (OK, idempotent-replayed) or FailedPrecondition
// operation-uncertain. A declined charge cut after the provider's answer
// is recovered too: its late retry gets FailedPrecondition "card
// declined" replayed. A call carrying a forged idem-recovery value is
// refused with PermissionDenied, executing nothing.
// On the same binaries, three recoverers race live clients
// (recoverRPCRaces): grpc-go on Redis and Connect on PostgreSQL, every
// pair with -soak.
func TestRecoverRPC(t *testing.T) {
	t.Parallel() // each mostly waits for leases to lapse, on its own provider, schema and prefix
	bin, provider := buildCrashBinaries(t)
	var wg sync.WaitGroup
	for i, door := range rpcDoors {
		for j, store := range []string{"redis", "postgres"} {
			wg.Go(func() {
				t.Run(door.name+"/"+store, func(t *testing.T) {
					env := newCrashEnv(t, store, bin, provider)
					st, closeStore, err := payments.OpenStore(env.cfg)
					if err != nil {
						t.Fatal(err)
					}
					defer closeStore()
					env.recoverRPC(t, st.(idem.Inspector), door)
				})
			})
			if i == j || *soak { // grpc-go on Redis, Connect on PostgreSQL; every pair with -soak
				wg.Go(func() {
					t.Run("races/"+door.name+"/"+store, func(t *testing.T) {
						recoverRPCRaces(t, newCrashEnv(t, store, bin, provider, "-latency", "300ms"), door)
					})
				})
			}
		}
	}
	wg.Wait()
}

// recoverRPC is TestRecoverRPC on env through door.
func (env *crashEnv) recoverRPC(t *testing.T, in idem.Inspector, door rpcDoor) {
	n := 8 // A: the first 4 points, B: the last 4: every point once, receipt-before-call twice
	if *soak {
		n = 8 * 6
	}
	before := env.stats(t)
	sent := env.rpcWave(t, door, n, recoverFlags, payments.PausePoints, rotatedPoints)
	c := env.start(t, append(slices.Clone(door.flags), recoverFlags...)...) // one instance restarted; no client comes back
	defer c.Stop()
	states := env.waitStates(t, in, sent, recoverWait)
	wantEmails, disturbed := int64(0), 0
	for _, p := range sent {
		if p.disturbed || p.point == "" {
			disturbed++ // a try failed on a loaded store, or ended before it was held: completed or uncertain (waitStates), effects bounded below
			continue
		}
		want := crashOutcomes[p.point]
		wantEmails += want.emails
		wantState := idem.StateCompleted
		if want.status == http.StatusConflict {
			wantState = idem.StateUncertain
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
		a := rpcSettled(door.name, c, p) // the client's late retry
		switch {
		case wantState == idem.StateCompleted && (a.code != codes.OK || !a.replayed || a.id == ""):
			t.Errorf("%s cut at %s: the late retry got %v %q (replayed %v, %v), want the payment replayed", p.user, p.point, a.code, a.msg, a.replayed, a.err)
		case wantState == idem.StateUncertain && (a.code != codes.FailedPrecondition || !strings.Contains(a.msg, "may or may not have taken effect")):
			t.Errorf("%s cut at %s: the late retry got %v %q (%v), want FailedPrecondition operation-uncertain", p.user, p.point, a.code, a.msg, a.err)
		}
		if wantState == idem.StateCompleted {
			if again := rpcSend(door.name, c, p); again.id != a.id || !again.replayed {
				t.Errorf("%s cut at %s: a second retry got %q (replayed %v), want %q replayed", p.user, p.point, again.id, again.replayed, a.id)
			}
		}
	}
	if disturbed > 0 {
		t.Logf("%d of %d calls disturbed by a loaded store before they were held", disturbed, n)
	}
	after := env.stats(t)
	if got := after.Charges - before.Charges; got != int64(n) {
		t.Errorf("provider: %d charges, want %d (one per call)", got, n)
	}
	if got := after.Emails - before.Emails; got < wantEmails || got > wantEmails+int64(disturbed) {
		t.Errorf("provider: %d receipts, want %d (one per call but where the crash came before the mail)", got, wantEmails)
	}
	// A declined charge cut after the provider's answer: the recovery
	// stores the decline, which the late retry gets replayed, status and
	// message.
	d := env.start(t, append(slices.Clone(door.flags), append(slices.Clone(quickRecoverFlags), "-pause-at", "charge-after-call")...)...) // a 2s lease
	declined := inflight{user: "declined-" + strings.ToLower(rand.Text()[:8]), key: rand.Text(), amount: payments.AmountDeclined, route: createPaymentProcedure}
	cut := make(chan struct{})
	go func() { defer close(cut); rpcSend(door.name, d, declined) }()
	if _, err := d.Line("paused at charge-after-call"); err != nil {
		t.Fatal(err)
	}
	d.Kill()
	<-cut
	if st := env.waitStates(t, in, []inflight{declined}, recoverWait); st[declined.key] != idem.StateCompleted {
		t.Errorf("the declined call cut after the provider's answer: %v, want completed", st[declined.key])
	}
	if a := rpcSettled(door.name, c, declined); a.code != codes.FailedPrecondition || !a.replayed || !strings.Contains(a.msg, "declined") {
		t.Errorf("the declined call's late retry got %v %q (replayed %v), want FailedPrecondition card declined replayed", a.code, a.msg, a.replayed)
	}
	after = env.stats(t)
	// A forged recovery marker: refused, nothing executed, no record.
	forged := inflight{user: "forger-" + strings.ToLower(rand.Text()[:8]), key: rand.Text(), amount: amount, route: createPaymentProcedure}
	a := rpcSend(door.name, c, forged, strings.ToLower(idem.RecoveryHeader), rand.Text())
	if a.code != codes.PermissionDenied || !strings.Contains(a.msg, "idem-recovery") {
		t.Errorf("a call with a forged idem-recovery value got %v %q (%v), want PermissionDenied recovery-refused", a.code, a.msg, a.err)
	}
	if _, found, err := in.Inspect(context.Background(), forged.scopedKey()); err != nil || found {
		t.Errorf("the forged call left a record (found %v, %v)", found, err)
	}
	if got := env.stats(t).Charges - after.Charges; got != 0 {
		t.Errorf("the forged call charged %d times", got)
	}
}

// recoverRPCRaces crashes 4 calls through door inside their charge step
// (env's provider taking 300ms a charge), then starts three instances
// with recoverers while every client retries through them at once: each
// record runs once at a time (the provider never sees two charge calls
// under one key at once), each call is charged once, and every instance
// replays the same payment.
func recoverRPCRaces(t *testing.T, env *crashEnv, door rpcDoor) {
	const n = 4
	before := env.stats(t)
	cut := []string{"charge-after-call"}
	sent := env.rpcWave(t, door, n, recoverFlags, cut, cut)
	var live []*procs.Proc
	for range 3 {
		p := env.start(t, append(slices.Clone(door.flags), recoverFlags...)...)
		defer p.Stop()
		live = append(live, p)
	}
	ids := make([]string, n)
	var clients sync.WaitGroup
	for i, p := range sent {
		clients.Go(func() {
			deadline := time.Now().Add(recoverWait)
			for {
				a := rpcSend(door.name, live[i%3], p)
				if a.code == codes.OK {
					ids[i] = a.id
					return
				}
				if a.code != codes.Aborted && a.code != codes.Unavailable || time.Now().After(deadline) {
					t.Errorf("%s: %v %q (%v), want the payment", p.user, a.code, a.msg, a.err)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
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
	for i, p := range sent {
		for _, l := range live {
			if a := rpcSettled(door.name, l, p); a.code != codes.OK || !a.replayed || a.id != ids[i] {
				t.Errorf("%s: %v %q (replayed %v), want %s replayed", p.user, a.code, a.id, a.replayed, ids[i])
			}
		}
		if env.rows != nil {
			if rows := env.rows(t, p.user); rows != 1 {
				t.Errorf("%s: %d ledger rows, want 1", p.user, rows)
			}
		}
	}
}
