package idem

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// TestReplayCheck: a caller the check refuses gets 403 "replay-forbidden"
// carrying nothing stored, for a replay (decoded or encoded store), a 409
// and a 422; the check sees the stored state and status; it never runs
// for a request that executes; once allowed again the replay comes back.
func TestReplayCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func() Store
	}{
		{"script store", func() Store { return newScriptStore(0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var revoked atomic.Bool
			refusal := errors.New("grant revoked")
			var mu sync.Mutex
			var infos []ReplayInfo
			var events []Event
			e, err := New(tc.store(), WithLogger(slog.New(slog.DiscardHandler)),
				WithEventHook(func(_ context.Context, ev Event) { mu.Lock(); events = append(events, ev); mu.Unlock() }),
				WithReplayCheck(func(_ context.Context, info ReplayInfo) error {
					mu.Lock()
					infos = append(infos, info)
					mu.Unlock()
					if revoked.Load() {
						return refusal
					}
					return nil
				}))
			if err != nil {
				t.Fatal(err)
			}
			req := func(key, body string) *Request {
				return &Request{Method: http.MethodPost, Route: "/r/:id", Path: "/r/7", Keys: []string{key}, Principal: "alice", Body: []byte(body)}
			}
			x, resp := e.Begin(context.Background(), req("k", `{"a":1}`))
			if x == nil {
				t.Fatalf("first request: %+v, want an execution", resp)
			}
			x.Write([]byte("secret body"))
			x.Finish(201, http.Header{"Location": {"/things/7"}, "Content-Type": {"text/plain"}})
			if len(infos) != 0 {
				t.Fatalf("the check ran for an execution: %+v", infos)
			}

			revoked.Store(true)
			wantForbidden := func(what string, resp *Response, outcome EventKind, state State, status int) {
				t.Helper()
				if resp == nil || resp.Status != 403 || resp.IsReplay() || bytes.Contains(resp.Body, []byte("secret")) {
					t.Fatalf("%s while revoked: %+v, want 403 without the stored response", what, resp)
				}
				resp.EachHeader(func(k, v string) {
					if k != "Content-Type" || v != "application/problem+json" {
						t.Fatalf("%s while revoked: header %s: %s leaked", what, k, v)
					}
				})
				if !bytes.Contains(resp.Body, []byte(ProblemTypeBase+"replay-forbidden")) {
					t.Fatalf("%s while revoked: body %s, want problem replay-forbidden", what, resp.Body)
				}
				mu.Lock()
				defer mu.Unlock()
				info, ev := infos[len(infos)-1], events[len(events)-1]
				if info.Outcome != outcome || info.State != state || info.Status != status || info.Principal != "alice" ||
					info.Method != "POST" || info.Route != "/r/:id" || info.Path != "/r/7" || len(info.Key) != 64 {
					t.Fatalf("%s: check saw %+v", what, info)
				}
				if ev.Kind != EventReplayForbidden || !errors.Is(ev.Err, refusal) || ev.Key != info.Key || ev.Op != OpAcquire || ev.Kind.String() != "replay-forbidden" {
					t.Fatalf("%s: event %+v, want replay-forbidden carrying the refusal", what, ev)
				}
			}
			_, resp = e.Begin(context.Background(), req("k", `{"a":1}`))
			wantForbidden("replay", resp, EventReplayed, StateCompleted, 201)
			_, resp = e.Begin(context.Background(), req("k", `{"a":2}`))
			wantForbidden("mismatch", resp, EventMismatch, StateCompleted, 0)

			held, _ := e.Begin(context.Background(), req("held", `{}`))
			if held == nil {
				t.Fatal("held: no execution")
			}
			_, resp = e.Begin(context.Background(), req("held", `{}`))
			wantForbidden("in progress", resp, EventConflict, StateInProgress, 0)
			held.Fail()

			if x, _ := e.Begin(context.Background(), req("fresh", `{}`)); x == nil {
				t.Fatal("a new key while revoked did not execute: the check is for stored outcomes only")
			} else {
				x.Finish(200, http.Header{})
			}

			revoked.Store(false)
			_, resp = e.Begin(context.Background(), req("k", `{"a":1}`))
			if resp == nil || resp.Status != 201 || !resp.IsReplay() || string(resp.Body) != "secret body" {
				t.Fatalf("replay once allowed: %+v", resp)
			}
		})
	}
}
