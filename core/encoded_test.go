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

// encodedStore is a scriptStore whose Acquire hands completed responses
// out encoded ([Record.Encoded]), or the bytes in corrupt when set.
type encodedStore struct {
	*scriptStore
	corrupt []byte
}

func (s *encodedStore) Acquire(ctx context.Context, key, token, fp string, lease time.Duration) (Record, bool, error) {
	rec, acquired, err := s.scriptStore.Acquire(ctx, key, token, fp, lease)
	if err != nil || acquired || rec.Response == nil {
		return rec, acquired, err
	}
	rec.Encoded, err = rec.Response.MarshalBinary()
	if s.corrupt != nil {
		rec.Encoded = s.corrupt
	}
	rec.Response = nil
	return rec, false, err
}

// TestEncodedReplay checks a replay read in place from a store's encoding:
// the same status, lines and body as one decoded from a plain Acquire,
// through every way adapters and stores read a Response.
func TestEncodedReplay(t *testing.T) {
	stored := http.Header{"Content-Type": {"application/json"}, "Link": {"<a>", "<b>"}, "X-Bin": {"\x00\xff"}}
	run := func(s Store) *Response {
		t.Helper()
		_, resp := completeAndRetry(t, s, func(x *Execution) {
			_, _ = x.Write([]byte(`{"id":1}`))
			x.Finish(201, stored.Clone())
		})
		if resp == nil || !resp.IsReplay() {
			t.Fatalf("second request = %+v; want a replay", resp)
		}
		return resp
	}
	plain := run(newScriptStore(0))
	inPlace := run(&encodedStore{scriptStore: newScriptStore(0)})
	if inPlace.Header != nil {
		t.Fatalf("in-place replay has a Header map %v; want lines read from the encoding", inPlace.Header)
	}
	lines := func(r *Response) []string {
		var out []string
		r.EachHeader(func(k, v string) { out = append(out, k+": "+v) })
		slices.Sort(out)
		return out
	}
	if got, want := lines(inPlace), lines(plain); !slices.Equal(got, want) || !slices.Contains(got, "Idempotent-Replayed: true") {
		t.Fatalf("EachHeader = %q; want %q", got, want)
	}
	if inPlace.Status != plain.Status || string(inPlace.Body) != string(plain.Body) {
		t.Fatalf("in place %d %q; want %d %q", inPlace.Status, inPlace.Body, plain.Status, plain.Body)
	}
	if c := inPlace.Clone(); !reflect.DeepEqual(c.Header, plain.Header) || string(c.Body) != string(plain.Body) {
		t.Fatalf("Clone = %v %q; want %v %q", c.Header, c.Body, plain.Header, plain.Body)
	}
	for _, r := range []*Response{plain, inPlace} {
		enc, err := r.AppendBinary(nil)
		var back Response
		if err != nil || back.UnmarshalBinary(enc) != nil || !reflect.DeepEqual(back.Header, plain.Header) {
			t.Fatalf("AppendBinary round trip = %v, %v; want %v", back.Header, err, plain.Header)
		}
	}
	a, b := httptest.NewRecorder(), httptest.NewRecorder()
	plain.Send(a)
	inPlace.Send(b)
	if !reflect.DeepEqual(a.Header(), b.Header()) || a.Code != b.Code || a.Body.String() != b.Body.String() {
		t.Fatalf("Send in place = %d %v %q; want %d %v %q", b.Code, b.Header(), b.Body, a.Code, a.Header(), a.Body)
	}
	b.Header()["Link"][0] = "changed" // the recorder's header is its own
	if slices.Contains(lines(inPlace), "Link: changed") {
		t.Fatal("writing the ResponseWriter's header changed the stored lines")
	}
}

// TestEncodedReplayCorrupt: bytes that do not decode are answered 500
// stored-result-unreadable, as a store's ErrCorrupt is.
func TestEncodedReplayCorrupt(t *testing.T) {
	s := &encodedStore{scriptStore: newScriptStore(0), corrupt: []byte{9, 9, 9}}
	e, resp := completeAndRetry(t, s, func(x *Execution) { x.Finish(201, http.Header{}) })
	if resp == nil || resp.Status != http.StatusInternalServerError || resp != e.problems.unreadable {
		t.Fatalf("replay of corrupt bytes = %+v; want the 500 stored-result-unreadable problem", resp)
	}
}

// A stored encoding that holds an Idempotent-Replayed line of its own (a
// record written before the name was unstored, or by another writer) is
// replayed in place with the marker exactly once, "true", as a decoded
// replay is (the engine sets the marker over the stored line).
func TestEncodedReplayMarkerOnce(t *testing.T) {
	enc, err := (&Response{Status: 201, Header: http.Header{ReplayedHeader: {"false"}, "Z": {"z"}}}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	r, err := sharedReplay(enc)
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
	if h := r.Clone().Header; !slices.Equal(h[ReplayedHeader], []string{"true"}) || h.Get("Z") != "z" {
		t.Fatalf("Clone header = %v", h)
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
	for _, s := range []Store{newScriptStore(0), &encodedStore{scriptStore: newScriptStore(0)}} {
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
