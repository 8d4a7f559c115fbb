package idem

import (
	"fmt"
	"math/rand"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"testing/quick"
)

// queryPair is a generated pair of raw queries and what decides their
// verdict: url.ParseQuery's ordered url.Values, the parsed request every
// handler reads (net/http's Request.URL.Query, Gin, Echo).
type queryPair struct{ A, B string }

// param is one logical query parameter before it is rendered.
type param struct{ name, value string }

var (
	genNames  = []string{"a", "b", "ab", "a b", "a=b", "é", "", "x~y"}
	genValues = []string{"", "1", "2", "1 2", "a+b", "~-._", "%", "&", "é", "1"}
)

// Generate builds either two renderings of the same parameters (must
// fingerprint alike) or a rendering of a mutation of them (values in
// another order within a name, a changed, dropped or added value), which
// may or may not parse alike: the oracle decides.
func (queryPair) Generate(r *rand.Rand, _ int) reflect.Value {
	ps := make([]param, r.Intn(6))
	for i := range ps {
		ps[i] = param{genNames[r.Intn(len(genNames))], genValues[r.Intn(len(genValues))]}
	}
	other := append([]param(nil), ps...)
	switch r.Intn(5) {
	case 0, 1: // the same parameters, rendered differently
	case 2: // swap two pairs (within a name this reorders its values)
		if len(other) > 1 {
			i, j := r.Intn(len(other)), r.Intn(len(other))
			other[i], other[j] = other[j], other[i]
		}
	case 3: // change or drop one
		if len(other) > 0 {
			i := r.Intn(len(other))
			if r.Intn(2) == 0 {
				other[i].value = genValues[r.Intn(len(genValues))]
			} else {
				other = append(other[:i], other[i+1:]...)
			}
		}
	case 4: // add one
		other = append(other, param{genNames[r.Intn(len(genNames))], genValues[r.Intn(len(genValues))]})
	}
	return reflect.ValueOf(queryPair{renderQuery(r, ps), renderQuery(r, other)})
}

// renderQuery writes ps as a raw query: the pairs of distinct names
// interleaved in a random order (the order within a name kept), each
// character literal when allowed or percent-encoded in either case, spaces
// as + or %20, "a" or "a=" for an empty value, with stray empty pairs.
func renderQuery(r *rand.Rand, ps []param) string {
	byName := map[string][]string{}
	var names []string
	for _, p := range ps {
		if _, ok := byName[p.name]; !ok {
			names = append(names, p.name)
		}
		byName[p.name] = append(byName[p.name], p.value)
	}
	var parts []string
	for left := len(ps); left > 0; left-- {
		var live []string
		for _, n := range names {
			if len(byName[n]) > 0 {
				live = append(live, n)
			}
		}
		n := live[r.Intn(len(live))]
		v := byName[n][0]
		byName[n] = byName[n][1:]
		part := encodeComponent(r, n)
		if v != "" || r.Intn(2) == 0 || n == "" {
			part += "=" + encodeComponent(r, v)
		}
		parts = append(parts, part)
		if r.Intn(6) == 0 {
			parts = append(parts, "")
		}
	}
	return strings.Join(parts, "&")
}

func encodeComponent(r *rand.Rand, s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		unreserved := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0
		switch {
		case c == ' ' && r.Intn(2) == 0:
			b.WriteByte('+')
		case unreserved && r.Intn(3) > 0:
			b.WriteByte(c)
		case r.Intn(2) == 0:
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			fmt.Fprintf(&b, "%%%02x", c)
		}
	}
	return b.String()
}

// TestFingerprintQueryProperty: two queries fingerprint alike exactly when
// url.ParseQuery gives them equal ordered values: the order of distinct
// names, + or %20, percent-encoding and "a" or "a=" never matter; the order
// of the values of one name, and any value, always do.
func TestFingerprintQueryProperty(t *testing.T) {
	alike, differ := 0, 0
	prop := func(q queryPair) bool {
		va, errA := url.ParseQuery(q.A)
		vb, errB := url.ParseQuery(q.B)
		if errA != nil || errB != nil {
			t.Fatalf("generator made an invalid query: %q %v, %q %v", q.A, errA, q.B, errB)
		}
		same := reflect.DeepEqual(va, vb)
		fa := Fingerprint("POST", "/p", q.A, "application/json", nil)
		fb := Fingerprint("POST", "/p", q.B, "application/json", nil)
		if same {
			alike++
		} else {
			differ++
		}
		if (fa == fb) != same {
			t.Errorf("%q and %q: parsed alike %v, fingerprints alike %v (%v vs %v)", q.A, q.B, same, fa == fb, va, vb)
			return false
		}
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 20000}); err != nil {
		t.Fatal(err)
	}
	if alike < 1000 || differ < 1000 {
		t.Fatalf("generator too one-sided: %d pairs alike, %d different", alike, differ)
	}
	t.Logf("%d pairs parsed alike, %d different", alike, differ)
}
