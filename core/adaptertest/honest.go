package adaptertest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// testReplayCheck: while the replay check refuses the caller, a replay, a
// 409 and a 422 all answer 403 "replay-forbidden" with nothing stored (no
// body, no stored header, no replay marker) and the handler does not run;
// once allowed, the replay comes back.
func (s *suite) testReplayCheck(t *testing.T) {
	var revoked atomic.Bool
	var checked atomic.Int64
	app, base := s.serve(t, nil, idem.WithReplayCheck(func(_ context.Context, info idem.ReplayInfo) error {
		checked.Add(1)
		if revoked.Load() && info.Principal == "alice" {
			return errors.New("grant revoked")
		}
		return nil
	}))
	first := s.do(t, base, call{path: "/a", body: `{"amount":100}`, keys: []string{"pay"}})
	if first.status != 201 || checked.Load() != 0 {
		t.Fatalf("first: %d, checks %d; want 201 without a check", first.status, checked.Load())
	}
	revoked.Store(true)
	wantForbidden := func(what string, r result) {
		t.Helper()
		wantProblem(t, r, http.StatusForbidden, "replay-forbidden")
		for _, h := range []string{idem.ReplayedHeader, "Location", "X-Multi", "Set-Cookie"} {
			if r.header.Get(h) != "" {
				t.Fatalf("%s: stored header %s leaked into the 403: %q", what, h, r.header.Values(h))
			}
		}
		if bytes.Contains(r.body, []byte("execution")) || bytes.Contains(r.body, first.body) {
			t.Fatalf("%s: stored body leaked into the 403: %s", what, r.body)
		}
	}
	wantForbidden("replay", s.do(t, base, call{path: "/a", body: `{"amount":100}`, keys: []string{"pay"}}))
	wantForbidden("other payload", s.do(t, base, call{path: "/a", body: `{"amount":999}`, keys: []string{"pay"}}))

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if r, err := s.send(base, call{path: "/a?hold=1", body: `{}`, keys: []string{"held"}, principal: "bob"}); err != nil || r.status != 201 {
			t.Errorf("held request: %v %d", err, r.status)
		}
	}()
	for deadline := time.Now().Add(2 * time.Minute); app.Executions() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("held request never reached the handler")
		}
	}
	// bob is not revoked: his duplicate gets the usual 409.
	wantProblem(t, s.do(t, base, call{path: "/a?hold=1", body: `{}`, keys: []string{"held"}, principal: "bob"}), http.StatusConflict, "in-progress")
	app.Release()
	wg.Wait()
	wantExecutions(t, app, 2)

	// A check refusing 409s: a duplicate of a request in progress gets 403.
	s2app, base2 := s.serve(t, nil, idem.WithReplayCheck(func(_ context.Context, info idem.ReplayInfo) error {
		if info.Outcome == idem.EventConflict {
			return errors.New("no peeking")
		}
		return nil
	}))
	wg.Add(1)
	go func() {
		defer wg.Done()
		if r, err := s.send(base2, call{path: "/a?hold=1", body: `{}`, keys: []string{"held"}}); err != nil || r.status != 201 {
			t.Errorf("held request: %v %d", err, r.status)
		}
	}()
	for deadline := time.Now().Add(2 * time.Minute); s2app.Executions() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("held request never reached the handler")
		}
	}
	wantForbidden("in progress", s.do(t, base2, call{path: "/a?hold=1", body: `{}`, keys: []string{"held"}}))
	s2app.Release()
	wg.Wait()
	wantExecutions(t, s2app, 1)

	revoked.Store(false)
	again := s.do(t, base, call{path: "/a", body: `{"amount":100}`, keys: []string{"pay"}})
	if again.status != 201 || again.header.Get(idem.ReplayedHeader) != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("allowed again: %d %s, want the replay", again.status, again.body)
	}
}

// testFingerprints: with a multipart fingerprint a body re-sent with
// another boundary replays; with a JSON fingerprint a re-ordered body and a
// changed excluded member replay while a changed member that counts is
// 422; the handler always reads the body as sent; a record made under a
// fingerprint function the engine does not know is 422
// fingerprint-changed.
func (s *suite) testFingerprints(t *testing.T) {
	app, base := s.serve(t, nil, idem.WithFingerprint(idem.MultipartFingerprint()))
	multipartCall := func(amount string) call {
		var b bytes.Buffer
		w := multipart.NewWriter(&b) // a random boundary each time
		_ = w.WriteField("amount", amount)
		f, _ := w.CreateFormFile("receipt", "r.txt")
		_, _ = io.WriteString(f, "receipt bytes")
		_ = w.Close()
		return call{path: "/a", body: b.String(), keys: []string{"upload"}, header: http.Header{"Content-Type": {w.FormDataContentType()}}}
	}
	first := s.do(t, base, multipartCall("10"))
	again := s.do(t, base, multipartCall("10"))
	if first.status != 201 || again.status != 201 || again.header.Get(idem.ReplayedHeader) != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("multipart with another boundary: %d, then %d %s; want the replay", first.status, again.status, again.body)
	}
	wantProblem(t, s.do(t, base, multipartCall("11")), http.StatusUnprocessableEntity, "key-reused")
	wantExecutions(t, app, 1)

	app, base = s.serve(t, nil, idem.WithFingerprint(idem.JSONFingerprintExcluding("/sent_at")))
	jsonCall := func(body string) call { return call{path: "/a", body: body, keys: []string{"pay"}} }
	first = s.do(t, base, jsonCall(`{"amount":100,"currency":"eur","sent_at":"10:00:00"}`))
	if first.status != 201 {
		t.Fatalf("first: %d", first.status)
	}
	for what, body := range map[string]string{
		"re-ordered":       `{"currency":"eur", "amount":100, "sent_at":"10:00:00"}`,
		"excluded changed": `{"amount":100,"currency":"eur","sent_at":"10:00:05"}`,
		"excluded dropped": `{"currency":"eur","amount":100}`,
	} {
		r := s.do(t, base, jsonCall(body))
		if r.status != 201 || r.header.Get(idem.ReplayedHeader) != "true" || !bytes.Equal(r.body, first.body) {
			t.Fatalf("%s: %d %s; want the replay", what, r.status, r.body)
		}
	}
	wantProblem(t, s.do(t, base, jsonCall(`{"amount":101,"currency":"eur","sent_at":"10:00:00"}`)), http.StatusUnprocessableEntity, "key-reused")
	wantExecutions(t, app, 1)

	app, base = s.serve(t, nil, idem.WithFingerprint(idem.JSONFingerprintOnly("/amount")))
	first = s.do(t, base, jsonCall(`{"amount":100,"note":"a"}`))
	if r := s.do(t, base, jsonCall(`{"note":"b","amount":100}`)); r.status != 201 || !bytes.Equal(r.body, first.body) {
		t.Fatalf("only /amount, other member changed: %d %s; want the replay", r.status, r.body)
	}
	wantProblem(t, s.do(t, base, jsonCall(`{"amount":200,"note":"a"}`)), http.StatusUnprocessableEntity, "key-reused")
	wantExecutions(t, app, 1)

	// A record made under a function this engine does not know (another
	// deploy's): 422 fingerprint-changed, nothing executed.
	store := s.cfg.NewStore(t)
	app, base = s.serve(t, store, idem.WithFingerprint(idem.JSONFingerprint()))
	if r := s.do(t, base, jsonCall(`{"amount":100}`)); r.status != 201 {
		t.Fatalf("first: %d", r.status)
	}
	other, otherBase := s.serve(t, store)
	wantProblem(t, s.do(t, otherBase, jsonCall(`{"amount":100}`)), http.StatusUnprocessableEntity, "fingerprint-changed")
	wantExecutions(t, app, 1)
	wantExecutions(t, other, 0)
}

// Crashable returns s, which must implement [idem.Keeper], as a store
// that keeps records but neither renews leases ([idem.Extender]) nor lives
// in the process ([idem.LocalStore]): an execution held in its handler
// loses its lease as a crashed holder's would, for tests driving the
// engine into "operation-uncertain" ([idem.WithUncertainAfterCrash]). It
// panics when s is not a Keeper.
func Crashable(s idem.Store) idem.Store {
	return keptStore{Store: s, Keeper: s.(idem.Keeper)}
}

type keptStore struct {
	idem.Store
	idem.Keeper
}

// testUncertain: under WithUncertainAfterCrash, a duplicate of a request
// whose lease lapsed without a completion gets 409 "operation-uncertain"
// without Retry-After, and the handler does not run again; the holder,
// slow rather than dead, still completes, and retries then replay.
func (s *suite) testUncertain(t *testing.T) {
	store := s.cfg.NewStore(t)
	if _, ok := store.(idem.Keeper); !ok {
		t.Fatalf("%T: the suite's store must implement idem.Keeper", store)
	}
	app, base := s.serve(t, Crashable(store),
		idem.WithStoreTimeout(250*time.Millisecond), idem.WithLease(time.Second), idem.WithUncertainAfterCrash(time.Hour))
	var wg sync.WaitGroup
	var first result
	wg.Add(1)
	go func() {
		defer wg.Done()
		r, err := s.send(base, call{path: "/a?hold=1", body: `{"amount":1}`, keys: []string{"charge"}})
		if err != nil {
			t.Errorf("held request: %v", err)
		}
		first = r
	}()
	for deadline := time.Now().Add(2 * time.Minute); app.Executions() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("held request never reached the handler")
		}
	}
	time.Sleep(1500 * time.Millisecond) // the 1s lease lapses: the holder looks crashed
	dup := s.do(t, base, call{path: "/a?hold=1", body: `{"amount":1}`, keys: []string{"charge"}})
	wantProblem(t, dup, http.StatusConflict, "operation-uncertain")
	if ra := dup.header.Get("Retry-After"); ra != "" {
		t.Fatalf("uncertain 409 carries Retry-After %q; want none (do not retry automatically)", ra)
	}
	wantExecutions(t, app, 1)
	app.Release()
	wg.Wait()
	if first.status != 201 {
		t.Fatalf("the slow holder answered %d %s; want 201", first.status, first.body)
	}
	again := s.do(t, base, call{path: "/a?hold=1", body: `{"amount":1}`, keys: []string{"charge"}})
	if again.status != 201 || again.header.Get(idem.ReplayedHeader) != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("after the holder completed: %d %s; want its replay", again.status, again.body)
	}
	wantExecutions(t, app, 1)
}

// testTombstones: under WithTombstones, a retry after the retention ended
// gets 410 "key-expired" and another payload with the key 422, and the
// handler does not run again.
func (s *suite) testTombstones(t *testing.T) {
	app, base := s.serve(t, nil, idem.WithRetention(300*time.Millisecond), idem.WithTombstones(time.Hour))
	first := s.do(t, base, call{path: "/a", body: `{"amount":100}`, keys: []string{"spent"}})
	if first.status != 201 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	time.Sleep(500 * time.Millisecond) // the retention ends; the tombstone stays
	late := s.do(t, base, call{path: "/a", body: `{"amount":100}`, keys: []string{"spent"}})
	wantProblem(t, late, http.StatusGone, "key-expired")
	if bytes.Contains(late.body, first.body) || late.header.Get(idem.ReplayedHeader) != "" {
		t.Fatalf("the 410 carries the expired response: %s", late.body)
	}
	wantProblem(t, s.do(t, base, call{path: "/a", body: `{"amount":999}`, keys: []string{"spent"}}), http.StatusUnprocessableEntity, "key-reused")
	wantExecutions(t, app, 1)
}
