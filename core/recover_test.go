package idem

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"testing"
)

// TestRecoveryPayloadRoundTrip: what the engine keeps decodes to what it
// was given; another version or a cut payload is ErrCorrupt.
func TestRecoveryPayloadRoundTrip(t *testing.T) {
	for _, r := range []recoveryRequest{
		{Kind: recoveryHTTP, Method: "POST", Route: "/v1/p/:id", Path: "/v1/p/7", RawQuery: "a=1&b=%20", CType: "application/json",
			Principal: "alice", Key: `k"\1`, Header: http.Header{"X-Source": {"app", "web"}}, Body: []byte{0, 1, 0xff}},
		{Kind: recoveryOp, Method: "scope", Route: "send", Key: "k", Body: nil},
		{Kind: recoveryOp, Method: "scope", Route: "send", Path: `{"to":"a@b"}`, Key: "k", Body: []byte("digest")},
	} {
		p := encodeRecovery(&r)
		got, err := decodeRecovery(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Body) == 0 {
			got.Body = nil
		}
		if !reflect.DeepEqual(*got, r) {
			t.Fatalf("decoded %+v, want %+v", *got, r)
		}
		for n := range len(p) - len(r.Body) { // cut before the body
			if _, err := decodeRecovery(p[:n]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("payload cut at %d: %v, want ErrCorrupt", n, err)
			}
		}
	}
	if _, err := decodeRecovery([]byte("iR\x02h")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("another version: %v", err)
	}
}

// TestSFStringParsesBack: a key re-sent by the recoverer parses to itself.
func TestSFStringParsesBack(t *testing.T) {
	for _, k := range []string{"abc", `a"b`, `a\b`, `"`, `\`, "x,y", "!~"} {
		got, err := ParseKey([]string{sfString(k)})
		if err != nil || got != k {
			t.Errorf("ParseKey(sfString(%q)) = %q, %v", k, got, err)
		}
	}
	if !bytes.Equal([]byte(sfString(`a"`)), []byte(`"a\""`)) {
		t.Error(sfString(`a"`))
	}
}
