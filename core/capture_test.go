package idem

import (
	"context"
	"net/http"
	"net/http/httptest"
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
