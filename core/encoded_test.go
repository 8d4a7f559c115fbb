package idem

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"testing"
	"time"
)

// corruptStore is a scriptStore whose Acquire hands out the bytes in
// corrupt as every completed record's response.
type corruptStore struct {
	*scriptStore
	corrupt []byte
}

func (s *corruptStore) Acquire(ctx context.Context, key, token, fp string, lease time.Duration) (Record, bool, error) {
	rec, acquired, err := s.scriptStore.Acquire(ctx, key, token, fp, lease)
	if err == nil && rec.State == StateCompleted {
		rec.Response = s.corrupt
	}
	return rec, acquired, err
}

// TestEncodedReplay checks a replay read in place from a store's bytes:
// the status, lines and body stored, plus the replay marker, through every
// way adapters read a Response, and the store's bytes stay unchanged.
func TestEncodedReplay(t *testing.T) {
	stored := http.Header{"Content-Type": {"application/json"}, "Link": {"<a>", "<b>"}, "X-Bin": {"\x00\xff"}}
	s := newScriptStore(0)
	_, replay := completeAndRetry(t, s, func(x *Execution) {
		_, _ = x.Write([]byte(`{"id":1}`))
		x.Finish(201, stored.Clone())
	})
	if replay == nil || !replay.IsReplay() || replay.Header != nil {
		t.Fatalf("second request = %+v; want a replay read in place (no Header map)", replay)
	}
	want := stored.Clone()
	want[ReplayedHeader] = []string{"true"}
	lines := http.Header{}
	replay.EachHeader(func(k, v string) { lines[k] = append(lines[k], v) })
	if !reflect.DeepEqual(lines, want) || !reflect.DeepEqual(replay.header(), want) {
		t.Fatalf("EachHeader = %v, header = %v; want %v", lines, replay.header(), want)
	}
	if replay.Status != 201 || string(replay.Body) != `{"id":1}` {
		t.Fatalf("replay %d %q", replay.Status, replay.Body)
	}
	w := httptest.NewRecorder()
	replay.Send(w)
	want.Set("Content-Length", "8")
	if !reflect.DeepEqual(w.Header(), want) || w.Code != 201 || w.Body.String() != `{"id":1}` {
		t.Fatalf("Send = %d %v %q", w.Code, w.Header(), w.Body)
	}
	w.Header()["Link"][0] = "changed" // the recorder's header is its own
	for _, rec := range s.recs {
		if got, err := DecodeResponse(rec.Response); err != nil || !reflect.DeepEqual(got.Header, stored) {
			t.Fatalf("stored response after the replay = %+v, %v; want header %v", got, err, stored)
		}
	}
}

// TestEncodedReplayCorrupt: bytes that do not decode are answered 500
// stored-result-unreadable, as a store's ErrCorrupt is.
func TestEncodedReplayCorrupt(t *testing.T) {
	s := &corruptStore{scriptStore: newScriptStore(0), corrupt: []byte{9, 9, 9}}
	e, resp := completeAndRetry(t, s, func(x *Execution) { x.Finish(201, http.Header{}) })
	if resp == nil || resp.Status != http.StatusInternalServerError || resp != e.problems.unreadable {
		t.Fatalf("replay of corrupt bytes = %+v; want the 500 stored-result-unreadable problem", resp)
	}
}

// A stored encoding that holds an Idempotent-Replayed line of its own (a
// record written before the name was unstored, or by another writer) is
// replayed in place with the marker exactly once, "true".
func TestEncodedReplayMarkerOnce(t *testing.T) {
	r, err := sharedReplay(encodeResponse(&Response{Status: 201, Header: http.Header{ReplayedHeader: {"false"}, "Z": {"z"}}}), true)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	r.EachHeader(func(k, v string) {
		if k == ReplayedHeader {
			got = append(got, v)
		}
	})
	if !slices.Equal(got, []string{"true"}) {
		t.Fatalf("Idempotent-Replayed lines = %q; want [true]", got)
	}
	if h := r.header(); !slices.Equal(h[ReplayedHeader], []string{"true"}) || h.Get("Z") != "z" {
		t.Fatalf("header = %v", h)
	}
}

// completeAndRetry runs one request on an engine over s to its end with
// finish, then its retry, and returns the engine and the retry's answer.
func completeAndRetry(t *testing.T, s Store, finish func(*Execution)) (*Engine, *Response) {
	t.Helper()
	e, err := New(s, WithGlobalScope())
	if err != nil {
		t.Fatal(err)
	}
	req := func() *Request {
		return &Request{Method: http.MethodPost, Path: "/p", Keys: []string{"k"}, Body: []byte("{}")}
	}
	x, resp := e.Begin(context.Background(), req())
	if x == nil {
		t.Fatalf("first request = %+v; want it to execute", resp)
	}
	finish(x)
	_, resp = e.Begin(context.Background(), req())
	return e, resp
}

// swapDelLines is a response header whose Del moves the last line into
// the gap, as fasthttp's does.
type swapDelLines [][2]string

func (l *swapDelLines) Add(k, v string) { *l = append(*l, [2]string{k, v}) }

func (l *swapDelLines) Del(k string) {
	for i := 0; i < len(*l); {
		if (*l)[i][0] == k {
			(*l)[i] = (*l)[len(*l)-1]
			*l = (*l)[:len(*l)-1]
			continue
		}
		i++
	}
}

// TestWriteLines: a replay replaces the lines of its names and keeps the
// order of each name's values, on a header whose Del reorders lines.
func TestWriteLines(t *testing.T) {
	stored := http.Header{"X-A": {"1", "2", "3"}, "X-B": {"b"}}
	for _, s := range []Store{newScriptStore(0)} {
		_, resp := completeAndRetry(t, s, func(x *Execution) { x.Finish(201, stored.Clone()) })
		h := swapDelLines{{"X-B", "retry's"}, {"X-Other", "kept"}, {"X-A", "retry's"}}
		resp.WriteLines(&h)
		got := map[string][]string{}
		for _, l := range h {
			got[l[0]] = append(got[l[0]], l[1])
		}
		want := map[string][]string{"X-A": {"1", "2", "3"}, "X-B": {"b"}, "X-Other": {"kept"}, ReplayedHeader: {"true"}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%T: lines after WriteLines = %v; want %v", s, got, want)
		}
	}
}
