package idem

import (
	"errors"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	ok := []struct {
		values []string
		want   string
	}{
		{[]string{"abc"}, "abc"},
		{[]string{`"abc"`}, "abc"},
		{[]string{"  abc\t"}, "abc"},
		{[]string{`"a\"b\\c"`}, `a"b\c`},
		{[]string{"550e8400-e29b-41d4-a716-446655440000"}, "550e8400-e29b-41d4-a716-446655440000"},
		{[]string{"abc", `"abc"`}, "abc"},
		{[]string{"abc, abc"}, "abc"},
		{[]string{`"abc",abc`}, "abc"},
		{[]string{"!#$%&'()*+-./:;<=>?@[]^_`{|}~"}, "!#$%&'()*+-./:;<=>?@[]^_`{|}~"},
		{[]string{strings.Repeat("x", 255)}, strings.Repeat("x", 255)},
		{[]string{`"a,b"`}, "a,b"},
		{[]string{`"\\"`}, `\`},
		{[]string{`"\"x"`}, `"x`},
		{[]string{`"\\abc"`, `\abc`}, `\abc`},
	}
	for _, tt := range ok {
		got, err := ParseKey(tt.values)
		if err != nil || got != tt.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", tt.values, got, err, tt.want)
		}
	}
	bad := []struct {
		values []string
		want   error
	}{
		{nil, ErrKeyMissing},
		{[]string{}, ErrKeyMissing},
		{[]string{""}, ErrKeyMalformed},
		{[]string{"   "}, ErrKeyMalformed},
		{[]string{`""`}, ErrKeyMalformed},
		{[]string{`"abc`}, ErrKeyMalformed},
		{[]string{`"ab"c`}, ErrKeyMalformed},
		{[]string{`"abc";p=1`}, ErrKeyMalformed},
		{[]string{`"a\nb"`}, ErrKeyMalformed},
		{[]string{`"a b"`}, ErrKeyMalformed},
		{[]string{"a b"}, ErrKeyMalformed},
		{[]string{"ab\"c"}, ErrKeyMalformed},
		{[]string{"ab\x00c"}, ErrKeyMalformed},
		{[]string{"ab\x7fc"}, ErrKeyMalformed},
		{[]string{"clé"}, ErrKeyMalformed},
		{[]string{"abc,"}, ErrKeyMalformed},
		{[]string{",abc"}, ErrKeyMalformed},
		{[]string{strings.Repeat("x", 256)}, ErrKeyTooLong},
		{[]string{`"` + strings.Repeat("x", 256) + `"`}, ErrKeyTooLong},
		{[]string{"a", "b"}, ErrKeyConflict},
		{[]string{"a, b"}, ErrKeyConflict},
		{[]string{"a", ""}, ErrKeyMalformed},
	}
	for _, tt := range bad {
		got, err := ParseKey(tt.values)
		if !errors.Is(err, tt.want) {
			t.Errorf("ParseKey(%q) = %q, %v; want %v", tt.values, got, err, tt.want)
		}
	}
}

// FuzzParseKey checks that every accepted key is 1-255 visible ASCII bytes,
// and that a bare key and its sf-string form name the same key.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, "a, a", `"x`, "a\x00", strings.Repeat("k", 300), "é", `"a\\"`} {
		f.Add(s, "")
	}
	f.Add("abc", `"abc"`)
	f.Fuzz(func(t *testing.T, a, b string) {
		values := []string{a}
		if b != "" {
			values = append(values, b)
		}
		k, err := ParseKey(values)
		if err != nil {
			return
		}
		if checkKey(k) != nil {
			t.Fatalf("ParseKey(%q) accepted invalid key %q", values, k)
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
		if k2, err := ParseKey([]string{quoted}); err != nil || k2 != k {
			t.Fatalf("sf-string form %q of %q parsed as %q, %v", quoted, k, k2, err)
		}
	})
}
