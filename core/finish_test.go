package idem

import (
	"context"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// FinishLines must store exactly what Finish stores for
// the same header: outer lines the handler left alone, unstored names, and
// names outside a WithStoredHeaders allowlist are dropped, and a not-stored
// answer keeps the Location even when the allowlist drops it. FinishLines
// (whose overflow path filters the header in place) is tried with the
// lines in a HeaderLines and past its capacity.
func TestFinishLinesStoresAsFinish(t *testing.T) {
	header := func() http.Header {
		return http.Header{
			"Location": {"/v1/payments/1"}, "Content-Type": {"application/json"},
			"X-Outer": {"outer"}, "X-Changed": {"handler's"}, "X-Request-Id": {"r1"}, "Set-Cookie": {"s=1", "t=2"},
		}
	}
	outer := http.Header{"X-Outer": {"outer"}, "X-Changed": {"outer"}}
	body := []byte(`{"id":1}`)
	lines := func(h http.Header, pad int) *HeaderLines {
		var l HeaderLines
		for k, vs := range h {
			for _, v := range vs {
				l.Add([]byte(k), []byte(v))
			}
		}
		for i := range pad { // past 32 lines: kept in an http.Header
			l.Add([]byte("X-Pad"), []byte(strconv.Itoa(i)))
		}
		return &l
	}
	finishers := []func(*Execution, int, http.Header){
		func(x *Execution, status int, h http.Header) { _, _ = x.Write(body); x.Finish(status, h) },
		func(x *Execution, status int, h http.Header) { x.FinishLines(status, lines(h, 0), body) },
		func(x *Execution, status int, h http.Header) {
			h["X-Pad"] = []string{}
			for i := range 40 {
				h["X-Pad"] = append(h["X-Pad"], strconv.Itoa(i))
			}
			_, _ = x.Write(body)
			x.Finish(status, h)
		},
		func(x *Execution, status int, h http.Header) { x.FinishLines(status, lines(h, 40), body) },
	}
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
			for i, finish := range finishers {
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
				if tc.unreplayable {
					x.Unreplayable()
				}
				finish(x, http.StatusCreated, header())
				rec, found, err := s.Get(context.Background(), x.ev.Key)
				if !found || err != nil || rec.State != StateCompleted {
					t.Fatalf("finish %d: record %+v, %v, %v; want completed", i, rec, found, err)
				}
				stored = append(stored, decoded(t, rec))
			}
			for i, want := range map[int]int{1: 0, 3: 2} {
				if !reflect.DeepEqual(stored[i], stored[want]) {
					t.Fatalf("finisher %d stored %+v, finisher %d (Finish) stored %+v", i, stored[i], want, stored[want])
				}
			}
			if tc.unreplayable && stored[1].Header.Get("Location") != "/v1/payments/1" {
				t.Fatalf("not-stored answer lost its Location: %v", stored[1].Header)
			}
			if _, ok := stored[1].Header["X-Outer"]; ok {
				t.Fatalf("outer line stored: %v", stored[1].Header)
			}
			if len(stored[1].Header["X-Changed"]) != 1 && !tc.unreplayable && tc.name != "allowlist" {
				t.Fatalf("outer line the handler changed not stored: %v", stored[1].Header)
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
	if info, ok := InfoFromContext(derived); !ok || info.Key != x.ev.Key || info.Replayed {
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
	if rec, _, _ := e.store.Get(context.Background(), x.ev.Key); rec.State != StateCompleted {
		t.Fatalf("completion after the request's cancellation: state %v", rec.State)
	}
}

// Frameworks that keep header names as set (Fiber's
// DisableHeaderNormalizing) hand FinishLines lower-case names: they must
// be matched against the canonical unstored names and outer lines as
// Finish matches an http.Header's, in the stack buffer and past it; a name
// that is not a token stays as given, as http.CanonicalHeaderKey leaves it.
func TestFinishLinesCanonicalNames(t *testing.T) {
	for _, pad := range []int{0, 40} {
		t.Run(strconv.Itoa(pad), func(t *testing.T) {
			s := newTxStore()
			e, err := New(s)
			if err != nil {
				t.Fatal(err)
			}
			x, resp := e.Begin(context.Background(), txRequest("k"))
			if x == nil {
				t.Fatalf("Begin = %+v", resp)
			}
			x.OuterHeader(http.Header{"X-Request-Id": {"r1"}})
			var l HeaderLines
			for _, line := range [][2]string{
				{"x-request-id", "r1"}, {"set-cookie", "s=1"}, {"idempotent-replayed", "false"},
				{"x-lower", "1"}, {"X-LOWER", "2"}, {"bad name", "3"}, {"cONTENT-tYPE", "text/plain"},
			} {
				l.Add([]byte(line[0]), []byte(line[1]))
			}
			for i := range pad {
				l.Add([]byte("x-pad"), []byte(strconv.Itoa(i)))
			}
			x.FinishLines(http.StatusCreated, &l, []byte("b"))
			rec, _, _ := s.Get(context.Background(), x.ev.Key)
			h := decoded(t, rec).Header
			want := http.Header{"X-Lower": {"1", "2"}, "bad name": {"3"}, "Content-Type": {"text/plain"}}
			if pad > 0 {
				want["X-Pad"] = h["X-Pad"]
				if len(h["X-Pad"]) != pad {
					t.Fatalf("X-Pad lines = %d, want %d", len(h["X-Pad"]), pad)
				}
			}
			if !reflect.DeepEqual(h, want) {
				t.Fatalf("stored header %v, want %v", h, want)
			}
		})
	}
}

// A status no HTTP client can receive again (outside 100-999) releases the
// key instead of storing a record every retry would find unreadable; nil
// lines are no lines.
func TestFinishEdgeStatusAndNilLines(t *testing.T) {
	for _, tc := range []struct {
		name   string
		finish func(*Execution)
		stored bool
	}{
		{"status 1000", func(x *Execution) { x.Finish(1000, http.Header{}) }, false},
		{"status 99", func(x *Execution) { x.FinishLines(99, nil, nil) }, false},
		{"nil lines", func(x *Execution) { x.FinishLines(http.StatusCreated, nil, []byte("ok")) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTxStore()
			e, err := New(s)
			if err != nil {
				t.Fatal(err)
			}
			x, _ := e.Begin(context.Background(), txRequest("k"))
			tc.finish(x)
			rec, found, _ := s.Get(context.Background(), x.ev.Key)
			if found != tc.stored || tc.stored && (rec.State != StateCompleted || string(decoded(t, rec).Body) != "ok") {
				t.Fatalf("record %+v, found %v; want stored=%v", rec, found, tc.stored)
			}
			if !tc.stored {
				if x2, resp := e.Begin(context.Background(), txRequest("k")); x2 == nil {
					t.Fatalf("retry after a released key = %+v; want it to execute", resp)
				}
			}
		})
	}
}

// decoded returns the response of the completed record rec.
func decoded(t *testing.T, rec Record) *Response {
	t.Helper()
	r, err := DecodeResponse(rec.Response)
	if err != nil {
		t.Fatalf("record %+v: %v", rec, err)
	}
	return r
}
