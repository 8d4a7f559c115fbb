package idem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"testing"
)

// encodeResponse encodes r as the engine stores it.
func encodeResponse(r *Response) []byte { return encodeAll(r) }

func TestResponseCodec(t *testing.T) {
	in := &Response{
		Status: 201,
		Header: http.Header{"Location": {"/a"}, "X-Multi": {"a, b", "", "c"}, "X-Bin": {"\x00\xff"}},
		Body:   []byte{0, 1, 2, 0xff, 0},
	}
	b := encodeResponse(in)
	// The layout, written out: names sorted, values in order.
	want := []byte{codecVersion, 0xc9, 0x01, 3}
	for _, l := range []struct {
		k  string
		vs []string
	}{{"Location", []string{"/a"}}, {"X-Bin", []string{"\x00\xff"}}, {"X-Multi", []string{"a, b", "", "c"}}} {
		want = appendString(want, l.k)
		want = binary.AppendUvarint(want, uint64(len(l.vs)))
		for _, v := range l.vs {
			want = appendString(want, v)
		}
	}
	want = append(want, in.Body...)
	if !bytes.Equal(b, want) {
		t.Fatalf("encoding = %x\nwant       %x", b, want)
	}
	out, err := DecodeResponse(b)
	if err != nil {
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
	empty, err := DecodeResponse(encodeResponse(&Response{Status: 204, Header: http.Header{"A": {"1"}}}))
	if err != nil || empty.Body == nil || len(empty.Body) != 0 {
		t.Fatalf("empty body decoded as %#v, %v; want a non-nil empty slice", empty, err)
	}
	empty.Body = append(empty.Body, 'x')
	if got := empty.Header.Get("A"); got != "1" {
		t.Fatalf("appending to an empty decoded body changed the header: A = %q", got)
	}
	for _, bad := range [][]byte{nil, {9}, {1}, {1, 0xc8, 0x01, 5}} {
		if _, err := DecodeResponse(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeResponse(%x) = %v; want ErrCorrupt", bad, err)
		}
	}
}

// TestCodecManyLines covers value and name counts of two-byte varints,
// whose room encode makes after writing the lines.
func TestCodecManyLines(t *testing.T) {
	h := http.Header{"A": make([]string, 300)}
	for i := range h["A"] {
		h["A"][i] = strconv.Itoa(i)
	}
	for i := range 200 {
		h["N"+strconv.Itoa(i)] = []string{"v"}
	}
	out, err := DecodeResponse(encodeResponse(&Response{Status: 200, Header: h, Body: []byte("body")}))
	if err != nil || !reflect.DeepEqual(out.Header, h) || string(out.Body) != "body" {
		t.Fatalf("round trip of %d names: %v", len(h), err)
	}
}

// FuzzResponseCodec checks that decoding never panics and that whatever
// decodes re-encodes to a response that decodes the same (a name without
// values has no lines, so it is not encoded again).
func FuzzResponseCodec(f *testing.F) {
	f.Add(encodeResponse(&Response{Status: 200, Header: http.Header{"A": {"1", "2"}}, Body: []byte("x")}))
	f.Add([]byte{1, 0xc8, 0x01, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeResponse(data)
		if err != nil {
			return
		}
		for k, vs := range r.Header {
			if len(vs) == 0 {
				delete(r.Header, k)
			}
		}
		r2, err := DecodeResponse(encodeResponse(r))
		if err != nil || r2.Status != r.Status || !bytes.Equal(r2.Body, r.Body) || !reflect.DeepEqual(r2.Header, r.Header) {
			t.Fatalf("re-decoded %+v, %v; want %+v", r2, err, r)
		}
	})
}

// FuzzSharedReplay checks that a replay read in place from any bytes
// DecodeResponse accepts has the same status, lines and body, through
// EachHeader, header and a new encoding, and never panics.
func FuzzSharedReplay(f *testing.F) {
	f.Add(encodeResponse(&Response{Status: 201, Header: http.Header{"A": {"1", "2"}, "B": {""}}, Body: []byte("x")}))
	f.Add([]byte{1, 0xc8, 0x01, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := sharedReplay(data, false)
		want, derr := DecodeResponse(data)
		if (err == nil) != (derr == nil) {
			t.Fatalf("sharedReplay error %v disagrees with DecodeResponse's %v", err, derr)
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
		if h := r.header(); !reflect.DeepEqual(h, want.Header) {
			t.Fatalf("header = %v; want %v", h, want.Header)
		}
		back, err := DecodeResponse(encodeAll(&Response{Status: r.Status, Header: r.header(), Body: r.Body}))
		if err != nil || back.Status != want.Status || !bytes.Equal(back.Body, want.Body) || !dup && !reflect.DeepEqual(back.Header, wantEach) {
			t.Fatalf("re-encoded = %+v, %v; want %+v", back, err, want)
		}
	})
}
