package idem

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RequestWithInfo must behave as r.WithContext(ContextWithInfo(...)): a
// copy of r whose context carries the Info and the parent's values and
// cancellation, r itself unchanged.
func TestRequestWithInfo(t *testing.T) {
	type k struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), k{}, "v"))
	defer cancel()
	r := httptest.NewRequestWithContext(parent, http.MethodPost, "/v1/payments?a=1", nil)
	r.Header.Set("X-Test", "t")
	got := RequestWithInfo(r, Info{Replayed: true})
	if got == r || got.Method != r.Method || got.URL != r.URL || got.Header.Get("X-Test") != "t" {
		t.Fatalf("RequestWithInfo = %+v; want a shallow copy of %+v", got, r)
	}
	if info, ok := InfoFromContext(got.Context()); !ok || !info.Replayed || info.Key != "" {
		t.Fatalf("InfoFromContext = %+v, %v; want Replayed", info, ok)
	}
	if _, ok := InfoFromContext(r.Context()); ok {
		t.Fatal("the original request's context carries the Info")
	}
	if got.Context().Value(k{}) != "v" {
		t.Fatal("the parent's value is lost")
	}
	cancel()
	select {
	case <-got.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the parent's cancellation did not reach the copy's context")
	}
}

// Capture must give the handler a CaptureWriter writing through to w and
// a copy of r carrying the execution's Info, as NewCaptureWriter and
// r.WithContext(x.WithInfo(r.Context())) do.
func TestCapture(t *testing.T) {
	s := newTxStore()
	e, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", nil)
	x, resp := e.Begin(r.Context(), txRequest("k"))
	if x == nil {
		t.Fatalf("Begin = %+v; want an execution", resp)
	}
	w := httptest.NewRecorder()
	cw, xr := x.Capture(w, r)
	if info, ok := InfoFromContext(xr.Context()); !ok || info.Key != x.ev.Key || info.Replayed {
		t.Fatalf("InfoFromContext = %+v, %v; want the execution's key", info, ok)
	}
	if _, ok := InfoFromContext(r.Context()); ok || xr == r || xr.URL != r.URL {
		t.Fatal("Capture changed the request instead of copying it")
	}
	cw.Header().Set("Content-Type", "text/plain")
	cw.WriteHeader(http.StatusCreated)
	_, _ = cw.Write([]byte("ok"))
	if cw.Status() != http.StatusCreated || w.Code != http.StatusCreated || w.Body.String() != "ok" {
		t.Fatalf("status %d, recorder %d %q; want 201 \"ok\" written through", cw.Status(), w.Code, w.Body)
	}
	x.Finish(cw.Status(), w.Header())
	rec, _, _ := s.Get(context.Background(), x.ev.Key)
	if got := decoded(t, rec); got.Status != http.StatusCreated || string(got.Body) != "ok" || got.Header.Get("Content-Type") != "text/plain" {
		t.Fatalf("stored %+v; want the 201 the handler wrote", got)
	}
}

// An execution's encoding buffer is reused by later executions only once
// its completion has ended: a completion retried in the background
// (WithCompletionRetry) stores its own bytes although other executions
// finish meanwhile, and each of those stores its own.
func TestEncodingBufferReuse(t *testing.T) {
	s := newScriptStore(0)
	e, err := New(s, WithGlobalScope(), WithCompletionRetry(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	run := func(key, body string) {
		x, resp := e.Begin(context.Background(), &Request{Method: http.MethodPost, Path: "/p", Keys: []string{key}, Body: []byte("{}")})
		if x == nil {
			t.Fatalf("Begin(%s) = %+v; want an execution", key, resp)
		}
		x.SnapshotHeader(http.Header{"Content-Type": {"text/plain"}})
		_, _ = x.Write([]byte(body))
		x.Finish(http.StatusCreated, nil)
	}
	blip := errors.New("connection reset")
	s.failNext(OpComplete, blip, blip) // the first completion and its immediate retry
	run("first", "the first response")
	for i := range 20 {
		run("k"+strconv.Itoa(i), "r"+strconv.Itoa(i)) // shorter: written over the first's bytes if its buffer were reused too early
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Close(ctx); err != nil { // waits for the background completion
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, want := range map[string]string{"first": "the first response", "k0": "r0", "k19": "r19"} {
		got := decoded(t, s.recs[ScopedKey("", http.MethodPost, "/p", key)])
		if got.Status != http.StatusCreated || string(got.Body) != want || got.Header.Get("Content-Type") != "text/plain" {
			t.Fatalf("%s stored %d %v %q; want 201 text/plain %q", key, got.Status, got.Header, got.Body, want)
		}
	}
}

// A replay BeginHTTP answers holds room for the header values Send sets;
// the first Send takes it, so a second Send (to another writer) gets
// values of its own, and a response with more values than the room holds
// is sent whole.
func TestReplaySendRoom(t *testing.T) {
	for _, n := range []int{1, sendRoom} { // within the room, past it
		e, err := New(newScriptStore(0), WithGlobalScope())
		if err != nil {
			t.Fatal(err)
		}
		stored := http.Header{"Content-Type": {"application/json"}}
		for i := range n - 1 {
			stored.Add("Link", "<"+strconv.Itoa(i)+">")
		}
		begin := func() (*Execution, *Response) {
			r := httptest.NewRequest(http.MethodPost, "/p", strings.NewReader("{}"))
			r.Header.Set(DefaultHeader, "k")
			return e.BeginHTTP(r, "/p", "")
		}
		x, _ := begin()
		if x == nil {
			t.Fatal("first request: no execution")
		}
		_, _ = x.Write([]byte("ok"))
		x.Finish(http.StatusCreated, stored.Clone())
		_, replay := begin()
		if replay == nil || !replay.IsReplay() {
			t.Fatalf("second request = %+v; want a replay", replay)
		}
		w1, w2 := httptest.NewRecorder(), httptest.NewRecorder()
		replay.Send(w1)
		w1.Header()["Content-Type"][0] = "changed" // in the first writer's header only
		replay.Send(w2)
		want := stored.Clone()
		want[ReplayedHeader] = []string{"true"}
		want["Content-Length"] = []string{"2"}
		if !reflect.DeepEqual(w2.Header(), want) || w2.Code != http.StatusCreated || w2.Body.String() != "ok" {
			t.Fatalf("%d values, second Send = %d %v %q; want 201 %v \"ok\"", n, w2.Code, w2.Header(), w2.Body, want)
		}
		if w1.Header().Get("Content-Type") != "changed" || w1.Header().Get("Content-Length") != "2" || len(w1.Header()["Link"]) != n-1 {
			t.Fatalf("%d values, first Send = %v", n, w1.Header())
		}
	}
}
