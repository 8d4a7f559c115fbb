package idem

import (
	"context"
	"net/http"
	"reflect"
	"testing"
	"time"
)

// FinishOwned must store exactly what Finish stores for the same header,
// filtering in place: outer lines the handler left alone, unstored names,
// and names outside a WithStoredHeaders allowlist are dropped, and a
// not-stored answer keeps the Location even when the allowlist drops it.
func TestFinishOwnedStoresAsFinish(t *testing.T) {
	header := func() http.Header {
		return http.Header{
			"Location": {"/v1/payments/1"}, "Content-Type": {"application/json"},
			"X-Outer": {"outer"}, "X-Request-Id": {"r1"}, "Set-Cookie": {"s=1"},
		}
	}
	outer := http.Header{"X-Outer": {"outer"}}
	for _, tc := range []struct {
		name         string
		opts         []Option
		unreplayable bool
	}{
		{name: "default"},
		{name: "allowlist", opts: []Option{WithStoredHeaders("Content-Type")}},
		{name: "unstored", opts: []Option{WithUnstoredHeaders("X-Request-Id")}},
		{name: "not-stored with Location outside the allowlist", opts: []Option{WithStoredHeaders("Content-Type")}, unreplayable: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stored []*Response
			for i, finish := range []func(*Execution, int, http.Header){(*Execution).Finish, (*Execution).FinishOwned} {
				s := newTxStore()
				e, err := New(s, tc.opts...)
				if err != nil {
					t.Fatal(err)
				}
				x, resp := e.Begin(context.Background(), txRequest("k"))
				if x == nil {
					t.Fatalf("Begin = %+v", resp)
				}
				x.OuterHeader(outer)
				_, _ = x.Write([]byte(`{"id":1}`))
				if tc.unreplayable {
					x.Unreplayable()
				}
				finish(x, http.StatusCreated, header())
				rec, found, err := s.Get(context.Background(), x.key)
				if !found || err != nil || rec.State != StateCompleted {
					t.Fatalf("finish %d: record %+v, %v, %v; want completed", i, rec, found, err)
				}
				stored = append(stored, rec.Response)
			}
			if !reflect.DeepEqual(stored[0], stored[1]) {
				t.Fatalf("Finish stored %+v, FinishOwned stored %+v", stored[0], stored[1])
			}
			if tc.unreplayable && stored[1].Header.Get("Location") != "/v1/payments/1" {
				t.Fatalf("not-stored answer lost its Location: %v", stored[1].Header)
			}
			if _, ok := stored[1].Header["X-Outer"]; ok {
				t.Fatalf("outer line stored: %v", stored[1].Header)
			}
		})
	}
}

// The handler's context (held in the Execution) must behave as
// context.WithValue: the Info and the parent's values are found through
// contexts derived from it, and the parent's cancellation reaches them.
func TestWithInfoContext(t *testing.T) {
	type k struct{}
	e, err := New(newTxStore())
	if err != nil {
		t.Fatal(err)
	}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), k{}, "v"))
	x, _ := e.Begin(parent, txRequest("k"))
	if x == nil {
		t.Fatal("Begin: no execution")
	}
	derived, stop := context.WithTimeout(x.WithInfo(parent), time.Hour)
	defer stop()
	if info, ok := InfoFromContext(derived); !ok || info.Key != x.key || info.Replayed {
		t.Fatalf("InfoFromContext = %+v, %v; want the execution's key", info, ok)
	}
	if derived.Value(k{}) != "v" {
		t.Fatal("the parent's value is lost")
	}
	cancel()
	select {
	case <-derived.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the parent's cancellation did not reach a derived context")
	}
	if x.ctx.Err() != nil || x.ctx.Value(k{}) != "v" {
		t.Fatalf("detached context: err %v, value %v; want no error and the parent's value", x.ctx.Err(), x.ctx.Value(k{}))
	}
	x.Finish(http.StatusCreated, http.Header{})
	if rec, _, _ := e.store.Get(context.Background(), x.key); rec.State != StateCompleted {
		t.Fatalf("completion after the request's cancellation: state %v", rec.State)
	}
}
