package idem

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// TestReadBody: a declared length (hint) only sizes the buffer; the bytes
// read are the reader's, within the limit + 1, whatever was declared.
func TestReadBody(t *testing.T) {
	const limit = 8
	for _, tc := range []struct {
		name, body string
		hint       int64
		want       string
		err        error
	}{
		{"unknown", "hello", 0, "hello", nil},
		{"exact", "hello", 6, "hello", nil},
		{"empty", "", 1, "", nil},
		{"declared short", "hello world", 6, "hello wor", nil}, // limit + 1
		{"declared short within limit", "hello!", 3, "hello!", nil},
		{"declared long", "hi", 6, "", io.ErrUnexpectedEOF},
		{"above limit", strings.Repeat("x", 20), 21, strings.Repeat("x", limit+1), nil},
	} {
		for _, into := range [][]byte{nil, make([]byte, 3), make([]byte, 64)} { // no room, too little, enough
			got, err := readBody(strings.NewReader(tc.body), limit, tc.hint, into)
			if !errors.Is(err, tc.err) || (err == nil && string(got) != tc.want) {
				t.Errorf("%s, room for %d: readBody = %q, %v; want %q, %v", tc.name, len(into), got, err, tc.want, tc.err)
			}
		}
	}
}
