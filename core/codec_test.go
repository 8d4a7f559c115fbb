package idem

import (
	"bytes"
	"context"
	"net/http"
	"reflect"
	"testing"
)

func TestResponseCodec(t *testing.T) {
	in := &Response{
		Status: 201,
		Header: http.Header{"Location": {"/a"}, "X-Multi": {"a, b", "", "c"}, "X-Bin": {"\x00\xff"}},
		Body:   []byte{0, 1, 2, 0xff, 0},
	}
	b, err := in.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var out Response
	if err := out.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if out.Status != in.Status || !reflect.DeepEqual(out.Header, in.Header) || !bytes.Equal(out.Body, in.Body) {
		t.Fatalf("round trip = %+v, want %+v", out, in)
	}
	b[len(b)-1] = 'X' // the decoded body must not alias the input
	if out.Body[len(out.Body)-1] != 0 {
		t.Fatal("decoded body aliases the encoded bytes")
	}
	// Header strings and body share one allocation: writing or appending to
	// the body must leave every header value intact.
	for i := range out.Body {
		out.Body[i] = 'Z'
	}
	out.Body = append(out.Body, "more"...)
	if !reflect.DeepEqual(out.Header, in.Header) {
		t.Fatalf("header after writing the body = %v, want %v", out.Header, in.Header)
	}
	var empty Response
	if err := empty.UnmarshalBinary(mustMarshal(t, &Response{Status: 204, Header: http.Header{"A": {"1"}}})); err != nil || empty.Body == nil || len(empty.Body) != 0 {
		t.Fatalf("empty body decoded as %#v, %v; want a non-nil empty slice", empty.Body, err)
	}
	empty.Body = append(empty.Body, 'x')
	if got := empty.Header.Get("A"); got != "1" {
		t.Fatalf("appending to an empty decoded body changed the header: A = %q", got)
	}
	for _, bad := range [][]byte{nil, {9}, {1}, {1, 0xc8, 0x01, 5}} {
		if err := new(Response).UnmarshalBinary(bad); err == nil {
			t.Errorf("UnmarshalBinary(%x) accepted corrupt input", bad)
		}
	}
}

func mustMarshal(t *testing.T, r *Response) []byte {
	t.Helper()
	b, err := r.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzResponseCodec checks that decoding never panics and that whatever
// decodes re-encodes to the same bytes.
func FuzzResponseCodec(f *testing.F) {
	seed, _ := (&Response{Status: 200, Header: http.Header{"A": {"1", "2"}}, Body: []byte("x")}).MarshalBinary()
	f.Add(seed)
	f.Add([]byte{1, 0xc8, 0x01, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Response
		if r.UnmarshalBinary(data) != nil {
			return
		}
		again, _ := r.MarshalBinary()
		var r2 Response
		if err := r2.UnmarshalBinary(again); err != nil || r2.Status != r.Status || !bytes.Equal(r2.Body, r.Body) || len(r2.Header) != len(r.Header) {
			t.Fatalf("re-decoding failed: %v", err)
		}
	})
}

// FuzzFinishLines checks that arbitrary header lines handed over with
// FinishLines store what Finish stores for the same lines in an
// http.Header (names canonicalised, outer lines, unstored names, the
// allowlist, the body limit), and that the encoded Response given to the
// store reads back the same through AppendBinary, EachHeader and a replay
// in place. data holds NUL-separated name, value fields; a one-byte name
// picks a name from a list, so that names repeat and collide with the
// policy's.
func FuzzFinishLines(f *testing.F) {
	f.Add([]byte("\x01\x00a\x00\x02\x00b\x00\x01\x00c\x00x-a\x00d"), uint8(3), false, 10)
	f.Add([]byte("\x05\x00\xff\xfe\x00\x06\x00\x00bad name\x00v"), uint8(1), true, 100)
	names := []string{"X-A", "x-a", "X-B", "Location", "Set-Cookie", "Content-Type", "X-Outer", "idempotent-replayed", "x-outer", "Date"}
	f.Fuzz(func(t *testing.T, data []byte, outerMask uint8, allow bool, bodyLen int) {
		fields := bytes.Split(data, []byte{0})
		var lines [][2][]byte
		for i := 0; i+1 < len(fields); i += 2 {
			k := fields[i]
			if len(k) == 1 {
				k = []byte(names[int(k[0])%len(names)])
			}
			lines = append(lines, [2][]byte{k, fields[i+1]})
		}
		outer := http.Header{}
		if outerMask&1 != 0 {
			outer["X-Outer"] = []string{"o"}
		}
		if outerMask&2 != 0 {
			outer["X-A"] = []string{"a"}
		}
		if outerMask&4 != 0 {
			outer["X-A"] = append(outer["X-A"], "c")
		}
		opts := []Option{WithMaxResponseBytes(64)}
		if allow {
			opts = append(opts, WithStoredHeaders("X-A", "Location", "x-outer"))
		}
		body := bytes.Repeat([]byte{0xab}, max(0, bodyLen%130))
		run := func(finish func(x *Execution)) (*Response, *Execution) {
			s := newTxStore()
			e, err := New(s, opts...)
			if err != nil {
				t.Fatal(err)
			}
			x, _ := e.Begin(context.Background(), txRequest("k"))
			x.OuterHeader(outer)
			finish(x)
			rec, _, _ := s.Get(context.Background(), x.ev.Key)
			if rec.State != StateCompleted || rec.Response == nil {
				t.Fatalf("record %+v; want completed", rec)
			}
			return rec.Response, x
		}
		want, _ := run(func(x *Execution) {
			h := http.Header{}
			for _, l := range lines {
				k := http.CanonicalHeaderKey(string(l[0]))
				h[k] = append(h[k], string(l[1]))
			}
			_, _ = x.Write(body)
			x.Finish(201, h)
		})
		got, x := run(func(x *Execution) {
			var hl HeaderLines
			for _, l := range lines {
				hl.Add(l[0], l[1])
			}
			x.FinishLines(201, &hl, body)
		})
		if got.Status != want.Status || !reflect.DeepEqual(got.Header, want.Header) || !bytes.Equal(got.Body, want.Body) {
			t.Fatalf("FinishLines stored %+v; Finish stored %+v", got, want)
		}
		if x.resp.Header != nil || len(body) > 64 {
			return // the overflow path (an http.Header) or the not-stored problem
		}
		enc, err := x.resp.AppendBinary(nil)
		var back Response
		if err != nil || back.UnmarshalBinary(enc) != nil || !reflect.DeepEqual(back.Header, want.Header) || !bytes.Equal(back.Body, want.Body) {
			t.Fatalf("AppendBinary round trip = %+v, %v; want %+v", back, err, want)
		}
		r, err := sharedReplay(enc)
		if err != nil {
			t.Fatal(err)
		}
		each := http.Header{}
		r.EachHeader(func(k, v string) { each[k] = append(each[k], v) })
		wantEach := want.Header.Clone()
		wantEach[ReplayedHeader] = []string{"true"}
		if !reflect.DeepEqual(each, wantEach) || !reflect.DeepEqual(r.Clone().Header, wantEach) {
			t.Fatalf("replay in place: EachHeader %v, Clone %v; want %v", each, r.Clone().Header, wantEach)
		}
	})
}

// FuzzSharedReplay checks that a replay read in place from any bytes
// UnmarshalBinary accepts has the same status, lines and body, through
// EachHeader, Clone and AppendBinary, and never panics.
func FuzzSharedReplay(f *testing.F) {
	seed, _ := (&Response{Status: 201, Header: http.Header{"A": {"1", "2"}, "B": {""}}, Body: []byte("x")}).MarshalBinary()
	f.Add(seed)
	f.Add([]byte{1, 0xc8, 0x01, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		var want Response
		r, err := sharedReplay(data)
		if (err == nil) != (want.UnmarshalBinary(data) == nil) {
			t.Fatalf("sharedReplay error %v disagrees with UnmarshalBinary", err)
		}
		if err != nil {
			return
		}
		if !r.IsReplay() || r.Header != nil {
			t.Fatalf("replay = %+v", r)
		}
		each := http.Header{}
		r.EachHeader(func(k, v string) { each[k] = append(each[k], v) })
		want.Header[ReplayedHeader] = []string{"true"}
		wantEach := http.Header{} // a name without values has no lines
		for k, vs := range want.Header {
			if len(vs) > 0 {
				wantEach[k] = vs
			}
		}
		dup, seen := false, map[string]bool{} // a name twice in data: the decoded map keeps the last
		d := strDecoder{s: r.wire.lines}
		for range r.wire.names {
			k := d.string()
			dup = dup || seen[k] && k != ReplayedHeader
			seen[k] = true
			for range d.uvarint() {
				d.string()
			}
		}
		if !dup && !reflect.DeepEqual(each, wantEach) {
			t.Fatalf("EachHeader = %v; want %v", each, wantEach)
		}
		c := r.Clone()
		if c.Status != want.Status || !reflect.DeepEqual(c.Header, want.Header) || !bytes.Equal(c.Body, want.Body) {
			t.Fatalf("Clone = %+v; want %+v", c, want)
		}
		enc, err := r.AppendBinary([]byte("prefix"))
		var back Response
		if err != nil || !bytes.HasPrefix(enc, []byte("prefix")) || back.UnmarshalBinary(enc[len("prefix"):]) != nil ||
			back.Status != want.Status || !reflect.DeepEqual(back.Header, want.Header) || !bytes.Equal(back.Body, want.Body) {
			t.Fatalf("AppendBinary = %+v, %v; want %+v", back, err, want)
		}
	})
}
