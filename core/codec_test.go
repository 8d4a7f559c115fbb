package idem

import (
	"bytes"
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
