package webhooks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/adapters/idemwebhook"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

// Every receiver behaviour on every store.
func TestReceiver(t *testing.T) {
	for name, newStore := range newStores() {
		t.Run(name, func(t *testing.T) {
			t.Run("ConcurrentDuplicates", func(t *testing.T) { testConcurrentDuplicates(t, newStore(t), nil) })
			t.Run("SendersRetrying", func(t *testing.T) { testSendersRetrying(t, newStore(t), nil) })
			t.Run("RedeliveryAfterCutResponse", func(t *testing.T) { testCutResponse(t, newStore(t)) })
			t.Run("Refusals", func(t *testing.T) { testRefusals(t, newStore(t)) })
			t.Run("SameIDOtherBody", func(t *testing.T) { testOtherBody(t, newStore(t)) })
			t.Run("HandlerFailureRetried", func(t *testing.T) { testHandlerFailure(t, newStore(t)) })
			t.Run("ScopedBySender", func(t *testing.T) { testScope(t, newStore(t)) })
		})
	}
}

// Twenty copies of one event, sent at once while its first delivery is
// processed: one runs, the nineteen others get 503 with Retry-After (never
// 409), and their retries get the stored answer. For both schemes.
func testConcurrentDuplicates(t *testing.T, store idem.Store, serve func(*testing.T, http.Handler, http.Handler) string) {
	rg := newRig(t, newEngine(t, store), serve)
	for _, sc := range []struct {
		sender, id, path string
		body             []byte
		sign             func(time.Time) http.Header
	}{
		{"billing", "msg_concurrent_" + randomHex(4), "/standard", nil, nil},
		{"stripe", "evt_concurrent_" + randomHex(4), "/stripe", nil, nil},
	} {
		if sc.sender == "billing" {
			sc.body = standardBody(sc.id)
			sc.sign = func(ts time.Time) http.Header { return rg.std.SignedHeader(sc.id, ts, sc.body) }
		} else {
			sc.body = stripeBody(sc.id)
			sc.sign = func(ts time.Time) http.Header { return rg.stripe.SignedHeader(ts, sc.body) }
		}
		release := rg.hold(sc.id)
		const copies = 20
		answers := make(chan answer, copies)
		var wg sync.WaitGroup
		for range copies {
			wg.Go(func() {
				a, err := rg.post(context.Background(), sc.path, sc.sign(time.Now()), sc.body)
				if err != nil {
					t.Errorf("%s: %v", sc.id, err)
				}
				answers <- a
			})
		}
		var got []answer
		for len(got) < copies-1 { // the one being processed answers after release
			got = append(got, <-answers)
		}
		release()
		wg.Wait()
		close(answers)
		for a := range answers {
			got = append(got, a)
		}
		first := 0
		var firstBody string
		for _, a := range got {
			switch {
			case a.Status == http.StatusOK && !a.Replayed:
				first++
				firstBody = a.Body
			case a.Status == http.StatusServiceUnavailable && a.Type == "webhook-in-progress" && a.RetryAfter != "":
			default:
				t.Errorf("%s: answer %s", sc.id, a)
			}
		}
		if first != 1 || rg.runsOf(sc.sender, sc.id) != 1 {
			t.Fatalf("%s: %d first answers, %d runs; want 1 and 1", sc.id, first, rg.runsOf(sc.sender, sc.id))
		}
		for range 3 { // the senders retry, each attempt signed anew
			a, err := rg.post(context.Background(), sc.path, sc.sign(time.Now()), sc.body)
			if err != nil || a.Status != http.StatusOK || !a.Replayed || a.Body != firstBody {
				t.Fatalf("%s: retry after processing: %s, %v; want 200 replayed %q", sc.id, a, err, firstBody)
			}
		}
		if n := rg.runsOf(sc.sender, sc.id); n != 1 {
			t.Fatalf("%s: %d runs", sc.id, n)
		}
	}
}

// Senders that duplicate and retry: 8 events, each delivered by 4
// concurrent sender loops that retry every non-2xx answer (each attempt
// signed anew, honouring Retry-After scaled down) until one is 2xx. Every
// loop ends with 2xx and the same body per event, and each event ran once.
func testSendersRetrying(t *testing.T, store idem.Store, serve func(*testing.T, http.Handler, http.Handler) string) {
	rg := newRig(t, newEngine(t, store), serve)
	const events, copies = 8, 4
	bodies := make([][copies]string, events)
	var wg sync.WaitGroup
	for i := range events {
		id := fmt.Sprintf("evt_retry_%s_%d", randomHex(4), i)
		body := stripeBody(id)
		for c := range copies {
			wg.Go(func() {
				deadline := time.Now().Add(60 * time.Second)
				for attempt := 1; ; attempt++ {
					a, err := rg.post(context.Background(), "/stripe", rg.stripe.SignedHeader(time.Now(), body), body)
					if err == nil && a.Status/100 == 2 {
						bodies[i][c] = a.Body
						return
					}
					if err == nil && (a.Status != http.StatusServiceUnavailable || a.RetryAfter == "") {
						t.Errorf("%s attempt %d: %s", id, attempt, a)
						return
					}
					if time.Now().After(deadline) {
						t.Errorf("%s: no 2xx after %d attempts: %s %v", id, attempt, a, err)
						return
					}
					time.Sleep(10 * time.Millisecond) // Retry-After, scaled down from seconds
				}
			})
		}
	}
	wg.Wait()
	for i := range events {
		for c := 1; c < copies; c++ {
			if bodies[i][c] != bodies[i][0] {
				t.Errorf("event %d: sender %d got %q, sender 0 %q", i, c, bodies[i][c], bodies[i][0])
			}
		}
	}
	rg.mu.Lock()
	defer rg.mu.Unlock()
	if len(rg.runs) != events {
		t.Errorf("%d events ran, want %d", len(rg.runs), events)
	}
	for k, n := range rg.runs {
		if n != 1 {
			t.Errorf("%s ran %d times", k, n)
		}
	}
}

// The sender gives up on a delivery mid-processing (its timeout, a cut
// connection): the handler's answer is still stored, a redelivery while it
// runs gets 503, and once it finished the redelivery gets its answer;
// the event ran once.
func testCutResponse(t *testing.T, store idem.Store) {
	rg := newRig(t, newEngine(t, store), nil)
	id := "msg_cut_" + randomHex(4)
	body := standardBody(id)
	release := rg.hold(id)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := rg.post(ctx, "/standard", rg.std.SignedHeader(id, time.Now(), body), body)
		done <- err
	}()
	if got := <-rg.started; got != id {
		t.Fatalf("started %q", got)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cut delivery: %v", err)
	}
	if a := rg.deliverStandard(id, time.Now(), body); a.Status != http.StatusServiceUnavailable || a.Type != "webhook-in-progress" {
		t.Fatalf("redelivery while processing: %s", a)
	}
	release()
	deadline := time.Now().Add(30 * time.Second)
	for {
		a := rg.deliverStandard(id, time.Now(), body)
		if a.Status == http.StatusOK {
			if !a.Replayed || a.Body != fmt.Sprintf(`{"event":%q,"run":1,"sum":%d}`+"\n", id, len(body)) {
				t.Fatalf("redelivery: %s", a)
			}
			break
		}
		if a.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("redelivery: %s", a)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := rg.runsOf("billing", id); n != 1 {
		t.Fatalf("%d runs", n)
	}
}

// Deliveries that must not be processed get 4xx and leave nothing behind:
// the same event, delivered properly afterwards, runs (once).
func testRefusals(t *testing.T, store idem.Store) {
	rg := newRig(t, newEngine(t, store), nil)
	forger, err := idemwebhook.NewStandardWebhooks("whsec_" + "QW5vdGhlclNlY3JldEFub3RoZXJTZWNyZXQ=")
	if err != nil {
		t.Fatal(err)
	}
	id := "msg_refused_" + randomHex(4)
	body := standardBody(id)
	now := time.Now()
	for _, c := range []struct {
		name     string
		header   http.Header
		body     []byte
		status   int
		typ      string
		method   string
		stripeTo bool
	}{
		{"forged signature", forger.SignedHeader(id, now, body), body, 400, "webhook-signature-invalid", "", false},
		{"tampered body", rg.std.SignedHeader(id, now, body), []byte(`{"type":"invoice.paid","data":{"amount":1}}`), 400, "webhook-signature-invalid", "", false},
		{"expired timestamp", rg.std.SignedHeader(id, now.Add(-10*time.Minute), body), body, 400, "webhook-timestamp-outside-tolerance", "", false},
		{"future timestamp", rg.std.SignedHeader(id, now.Add(10*time.Minute), body), body, 400, "webhook-timestamp-outside-tolerance", "", false},
		{"no headers", http.Header{}, body, 400, "webhook-malformed", "", false},
		{"event id not ASCII", rg.std.SignedHeader("msg_é", now, body), body, 400, "webhook-malformed", "", false},
		{"GET", rg.std.SignedHeader(id, now, body), nil, 405, "webhook-malformed", http.MethodGet, false},
		{"too large", rg.std.SignedHeader(id, now, body), make([]byte, idemwebhook.DefaultMaxBodyBytes+1), 413, "body-too-large", "", false},
		{"stripe without Stripe-Signature", rg.std.SignedHeader(id, now, body), body, 400, "webhook-malformed", "", true},
		{"stripe without id", rg.stripe.SignedHeader(now, []byte(`{"object":"event"}`)), []byte(`{"object":"event"}`), 400, "webhook-malformed", "", true},
	} {
		path := "/standard"
		if c.stripeTo {
			path = "/stripe"
		}
		var a answer
		if c.method == http.MethodGet {
			req, _ := http.NewRequest(http.MethodGet, rg.url+path, nil)
			resp, err := rg.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			a = answer{Status: resp.StatusCode, Type: "webhook-malformed"}
			if resp.Header.Get("Allow") != http.MethodPost {
				t.Errorf("GET: Allow %q", resp.Header.Get("Allow"))
			}
		} else if a, err = rg.post(context.Background(), path, c.header, c.body); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if a.Status != c.status || a.Type != c.typ {
			t.Errorf("%s: %s, want %d %s", c.name, a, c.status, c.typ)
		}
	}
	if a := rg.deliverStandard(id, time.Now(), body); a.Status != http.StatusOK || a.Replayed {
		t.Fatalf("proper delivery after the refusals: %s", a)
	}
	rg.mu.Lock()
	defer rg.mu.Unlock()
	if len(rg.runs) != 1 || rg.runs["billing/"+id] != 1 {
		t.Fatalf("runs %v, want only billing/%s once", rg.runs, id)
	}
}

// A validly signed delivery reusing a processed event's id with another
// body is refused with 422 and not processed; the original still replays.
func testOtherBody(t *testing.T, store idem.Store) {
	rg := newRig(t, newEngine(t, store), nil)
	id := "evt_other_" + randomHex(4)
	body := stripeBody(id)
	first := rg.deliverStripe(time.Now(), body)
	if first.Status != http.StatusOK {
		t.Fatalf("first: %s", first)
	}
	other := append(stripeBody(id)[:0:0], stripeBody(id)...)
	other = append(other[:len(other)-1], []byte(`,"livemode":true}`)...)
	if a := rg.deliverStripe(time.Now(), other); a.Status != http.StatusUnprocessableEntity || a.Type != "key-reused" {
		t.Fatalf("other body: %s", a)
	}
	if a := rg.deliverStripe(time.Now(), body); a.Status != http.StatusOK || !a.Replayed || a.Body != first.Body {
		t.Fatalf("redelivery: %s", a)
	}
	if n := rg.runsOf("stripe", id); n != 1 {
		t.Fatalf("%d runs", n)
	}
}

// A handler that answers 5xx releases the event: the sender's retry runs
// it again, and from then on redeliveries replay the success.
func testHandlerFailure(t *testing.T, store idem.Store) {
	rg := newRig(t, newEngine(t, store), nil)
	id := "msg_fail_" + randomHex(4)
	body := standardBody(id)
	rg.mu.Lock()
	rg.failNext[id] = true
	rg.mu.Unlock()
	if a := rg.deliverStandard(id, time.Now(), body); a.Status != http.StatusInternalServerError {
		t.Fatalf("failing run: %s", a)
	}
	ok := rg.deliverStandard(id, time.Now(), body)
	if ok.Status != http.StatusOK || ok.Replayed || ok.Body != fmt.Sprintf(`{"event":%q,"run":2,"sum":%d}`+"\n", id, len(body)) {
		t.Fatalf("retry: %s", ok)
	}
	if a := rg.deliverStandard(id, time.Now(), body); a.Status != http.StatusOK || !a.Replayed || a.Body != ok.Body {
		t.Fatalf("redelivery: %s", a)
	}
}

// Event ids are scoped by sender: the same id from two senders names two
// events, each processed once.
func testScope(t *testing.T, store idem.Store) {
	e := newEngine(t, store)
	rg := newRig(t, e, nil)
	other := idemwebhook.New(e, "billing-eu", rg.std)(http.HandlerFunc(rg.handle))
	mux := http.NewServeMux()
	mux.Handle("POST /standard", other) // the same route, another sender
	srv := newServer(t, mux)
	id := "msg_scope_" + randomHex(4)
	body := standardBody(id)
	for range 2 {
		rg.deliverStandard(id, time.Now(), body)
		a, err := rg.postTo(srv, "/standard", rg.std.SignedHeader(id, time.Now(), body), body)
		if err != nil || a.Status != http.StatusOK {
			t.Fatalf("billing-eu: %s %v", a, err)
		}
	}
	if rg.runsOf("billing", id) != 1 || rg.runsOf("billing-eu", id) != 1 {
		t.Fatalf("runs %v", rg.runs)
	}
}

// Verification comes before any store call, and a store outage answers
// 503 with Retry-After and processes nothing: a private redis-server is
// killed (forged and stale deliveries still get 400, valid ones 503,
// including redeliveries of a processed event) and started again on the
// same port with its data (then the new event runs once and the old one
// replays).
func TestStoreOutage(t *testing.T) {
	p, c := privateRedis(t)
	e := newEngine(t, newRedisStore(c), idem.WithStoreTimeout(time.Second), idem.WithLogger(slog.New(slog.DiscardHandler)))
	rg := newRig(t, e, nil)
	done, pending := "evt_outage_done_"+randomHex(4), "evt_outage_new_"+randomHex(4)
	first := rg.deliverStripe(time.Now(), stripeBody(done))
	if first.Status != http.StatusOK {
		t.Fatalf("before the outage: %s", first)
	}
	p.stop()
	forger, _ := idemwebhook.NewStripe("whsec_forger")
	if a, err := rg.post(context.Background(), "/stripe", forger.SignedHeader(time.Now(), stripeBody(pending)), stripeBody(pending)); err != nil || a.Status != 400 || a.Type != "webhook-signature-invalid" {
		t.Fatalf("forged during the outage: %s %v", a, err)
	}
	if a := rg.deliverStripe(time.Now().Add(-time.Hour), stripeBody(pending)); a.Status != 400 || a.Type != "webhook-timestamp-outside-tolerance" {
		t.Fatalf("stale during the outage: %s", a)
	}
	for _, id := range []string{pending, done} {
		a := rg.deliverStripe(time.Now(), stripeBody(id))
		if a.Status != http.StatusServiceUnavailable || a.Type != "store-unavailable" || a.RetryAfter == "" {
			t.Fatalf("%s during the outage: %s", id, a)
		}
		if secs, err := strconv.Atoi(a.RetryAfter); err != nil || secs < 1 {
			t.Fatalf("Retry-After %q", a.RetryAfter)
		}
	}
	if n := rg.runsOf("stripe", pending); n != 0 {
		t.Fatalf("%s ran %d times during the outage", pending, n)
	}
	startRedis(t, p.addr, p.dir)
	deadline := time.Now().Add(30 * time.Second)
	for {
		a := rg.deliverStripe(time.Now(), stripeBody(pending))
		if a.Status == http.StatusOK && !a.Replayed {
			break
		}
		if a.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("after the outage: %s", a)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if a := rg.deliverStripe(time.Now(), stripeBody(done)); a.Status != http.StatusOK || !a.Replayed || a.Body != first.Body {
		t.Fatalf("processed event after the outage: %s", a)
	}
	if rg.runsOf("stripe", pending) != 1 || rg.runsOf("stripe", done) != 1 {
		t.Fatalf("runs %v", rg.runs)
	}
}

// A Scheme error that is no verdict (a key server down) answers 503, so the
// sender retries; the event is not processed.
func TestSchemeUnavailable(t *testing.T) {
	e := newEngine(t, newStores()["memory"](t))
	keyServerDown := errors.New("key server unreachable")
	h := idemwebhook.New(e, "custom", idemwebhook.SchemeFunc(func(http.Header, []byte, time.Time) (idemwebhook.Delivery, error) {
		return idemwebhook.Delivery{}, keyServerDown
	}))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("handler ran") }))
	srv := newServer(t, h)
	rg := &rig{t: t, client: &http.Client{Timeout: 30 * time.Second}}
	a, err := rg.postTo(srv, "/", http.Header{}, []byte(`{}`))
	if err != nil || a.Status != http.StatusServiceUnavailable || a.Type != "webhook-verification-failed" {
		t.Fatalf("%s %v", a, err)
	}
	rg.client.CloseIdleConnections()
}

// New refuses missing arguments and a body limit out of range.
func TestNewRefuses(t *testing.T) {
	std, _ := schemes(t)
	ok := newEngine(t, newStores()["memory"](t))
	for name, build := range map[string]func(){
		"no engine":    func() { idemwebhook.New(nil, "s", std) },
		"no sender":    func() { idemwebhook.New(ok, "", std) },
		"no scheme":    func() { idemwebhook.New(ok, "s", nil) },
		"body limit 0": func() { idemwebhook.New(ok, "s", std, idemwebhook.WithMaxBodyBytes(0)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			build()
		}()
	}
}

// The engine's 410 answers never reach a sender (Standard Webhooks: 410
// means "stop sending"): a redelivery after the retention, under
// idem.WithTombstones, and one whose stored answer was too large to keep,
// get the original status with Idempotent-Replayed and no body, and the
// event does not run again.
func TestGoneTranslated(t *testing.T) {
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	store := memstore.New(memstore.WithClock(clock))
	t.Cleanup(func() { _ = store.Close() })
	e := newEngine(t, store, idem.WithRetention(time.Hour), idem.WithTombstones(24*time.Hour), idem.WithMaxResponseBytes(24))
	rg := newRig(t, e, nil)
	id := "msg_gone_" + randomHex(4)
	body := standardBody(id)
	if a := rg.deliverStandard(id, time.Now(), body); a.Status != http.StatusOK || a.Replayed {
		t.Fatalf("first: %s", a)
	}
	// The handler's answer (about 60 bytes) was over the 24-byte limit.
	if a := rg.deliverStandard(id, time.Now(), body); a.Status != http.StatusOK || !a.Replayed || a.Body != "" {
		t.Fatalf("redelivery of an answer not stored: %s", a)
	}
	mu.Lock()
	now = now.Add(2 * time.Hour) // past the retention: a tombstone is left
	mu.Unlock()
	if a := rg.deliverStandard(id, time.Now(), body); a.Status != http.StatusOK || !a.Replayed || a.Body != "" {
		t.Fatalf("redelivery after the retention: %s", a)
	}
	if n := rg.runsOf("billing", id); n != 1 {
		t.Fatalf("%d runs", n)
	}
}

// An event whose processing died mid-way under idem.WithUncertainAfterCrash
// is refused with 503 operation-uncertain (not 409) until an operator
// resolves it: its record is the one a crashed holder leaves in Redis (a
// lease nobody renews), under the scoped key the receiver uses
// (idem.ScopedKey(sender, "POST", route, id)).
func TestUncertainTranslated(t *testing.T) {
	store := newStores()["redis"](t)
	e := newEngine(t, store, idem.WithUncertainAfterCrash(time.Hour))
	rg := newRig(t, e, nil)
	id := "msg_crashed_" + randomHex(4)
	body := standardBody(id)
	key := idem.ScopedKey("billing", http.MethodPost, "/standard", id)
	fp := idem.Fingerprint(http.MethodPost, "/standard", "", "", body)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, ok, err := store.(idem.Keeper).AcquireKeep(ctx, key, "crashed-holder", fp, 300*time.Millisecond, idem.Keep{Uncertain: time.Hour}); !ok || err != nil {
		t.Fatalf("crashed holder's acquire: %v %v", ok, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		a := rg.deliverStandard(id, time.Now(), body)
		if a.Status == http.StatusServiceUnavailable && a.Type == "operation-uncertain" && a.RetryAfter == "" {
			break
		}
		if a.Status != http.StatusServiceUnavailable || a.Type != "webhook-in-progress" || time.Now().After(deadline) {
			t.Fatalf("delivery of a crashed event: %s", a)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := rg.runsOf("billing", id); n != 0 {
		t.Fatalf("%d runs", n)
	}
}
