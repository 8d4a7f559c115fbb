package idem

import (
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"testing/quick"
)

// jsonPair is a generated pair of JSON renderings and whether they hold
// the same value: either two renderings of one value (members in another
// order, other whitespace, other string escapes) or renderings of a value
// and of a mutation of it (a changed leaf, a member dropped or added, two
// array elements swapped).
type jsonPair struct {
	A, B string
	Same bool
}

// jv is a generated JSON value: a leaf (its JSON text), an array or an
// object (names and values in parallel).
type jv struct {
	leaf  string
	arr   []*jv
	names []string
	obj   []*jv
	isObj bool
}

var (
	genLeaves   = []string{"0", "1", "1.0", "-2e3", "true", "false", "null", `""`, `"a"`, `"é"`, `"a\"b"`, `"/"`}
	genJSONKeys = []string{"a", "b", "ab", "é", "", "a/b", "~", "sent_at"}
)

func genValue(r *rand.Rand, depth int) *jv {
	switch k := r.Intn(4); {
	case depth > 2 || k == 0 || k == 1:
		return &jv{leaf: genLeaves[r.Intn(len(genLeaves))]}
	case k == 2:
		v := &jv{arr: make([]*jv, r.Intn(4))}
		for i := range v.arr {
			v.arr[i] = genValue(r, depth+1)
		}
		return v
	default:
		v := &jv{isObj: true}
		for _, i := range r.Perm(len(genJSONKeys))[:r.Intn(5)] {
			v.names = append(v.names, genJSONKeys[i])
			v.obj = append(v.obj, genValue(r, depth+1))
		}
		return v
	}
}

// mutate changes v in place and reports whether it did.
func mutate(r *rand.Rand, v *jv) bool {
	switch {
	case v.isObj && len(v.obj) > 0 && r.Intn(3) > 0:
		i := r.Intn(len(v.obj))
		if r.Intn(3) == 0 { // drop it
			v.names, v.obj = append(v.names[:i:i], v.names[i+1:]...), append(v.obj[:i:i], v.obj[i+1:]...)
			return true
		}
		return mutate(r, v.obj[i])
	case v.isObj:
		for _, k := range genJSONKeys {
			if !slicesContains(v.names, k) {
				v.names, v.obj = append(v.names, k), append(v.obj, &jv{leaf: "1"})
				return true
			}
		}
		return false
	case len(v.arr) > 0:
		if i, j := r.Intn(len(v.arr)), r.Intn(len(v.arr)); r.Intn(3) == 0 && render(nil, v.arr[i], false) != render(nil, v.arr[j], false) {
			v.arr[i], v.arr[j] = v.arr[j], v.arr[i]
			return true
		}
		return mutate(r, v.arr[r.Intn(len(v.arr))])
	case v.arr != nil:
		v.arr = append(v.arr, &jv{leaf: "null"})
		return true
	}
	old := v.leaf
	for v.leaf == old || (old == `"a"` && v.leaf == `"a"`) {
		v.leaf = genLeaves[r.Intn(len(genLeaves))]
	}
	return true
}

func slicesContains(s []string, x string) bool {
	for _, y := range s {
		if y == x {
			return true
		}
	}
	return false
}

// render writes v as JSON; with r, members in a random order, random
// whitespace and strings escaped at random (\uXXXX for letters).
func render(r *rand.Rand, v *jv, _ bool) string {
	ws := func() string {
		if r == nil || r.Intn(3) > 0 {
			return ""
		}
		return []string{" ", "\n", "\t ", "\r\n"}[r.Intn(4)]
	}
	str := func(s string) string {
		var b strings.Builder
		b.WriteByte('"')
		for _, c := range s {
			switch {
			case c == '"' || c == '\\':
				b.WriteString(`\` + string(c))
			case r != nil && r.Intn(3) == 0:
				fmt.Fprintf(&b, `\u%04x`, c)
			default:
				b.WriteRune(c)
			}
		}
		b.WriteByte('"')
		return b.String()
	}
	switch {
	case v.isObj:
		order := make([]int, len(v.obj))
		for i := range order {
			order[i] = i
		}
		if r != nil {
			order = r.Perm(len(v.obj))
		}
		parts := make([]string, len(order))
		for i, j := range order {
			parts[i] = ws() + str(v.names[j]) + ws() + ":" + ws() + render(r, v.obj[j], false) + ws()
		}
		return "{" + strings.Join(parts, ",") + ws() + "}"
	case v.arr != nil:
		parts := make([]string, len(v.arr))
		for i, e := range v.arr {
			parts[i] = ws() + render(r, e, false) + ws()
		}
		return "[" + strings.Join(parts, ",") + "]"
	case r != nil && strings.HasPrefix(v.leaf, `"`) && !strings.Contains(v.leaf, `\`):
		return str(v.leaf[1 : len(v.leaf)-1])
	}
	return v.leaf
}

// Generate renders a value twice, or a value and a mutation of it.
func (jsonPair) Generate(r *rand.Rand, _ int) reflect.Value {
	v := genValue(r, 0)
	a := render(r, v, false)
	same := r.Intn(2) == 0 || !mutate(r, v)
	return reflect.ValueOf(jsonPair{a, render(r, v, false), same})
}

// TestJSONFingerprintProperty: two renderings fingerprint alike exactly
// when they hold the same value: member order, whitespace and string
// escapes never matter; a changed leaf, a member dropped or added, or two
// different array elements swapped always do.
func TestJSONFingerprintProperty(t *testing.T) {
	f := JSONFingerprint()
	alike, differ := 0, 0
	prop := func(p jsonPair) bool {
		if p.Same {
			alike++
		} else {
			differ++
		}
		if got := jsonFP(f, p.A) == jsonFP(f, p.B); got != p.Same {
			t.Errorf("%s and %s: same value %v, fingerprints alike %v", p.A, p.B, p.Same, got)
			return false
		}
		if _, err := f.canon(nil, "application/json", []byte(p.A)); err != nil {
			t.Errorf("%s: not read as JSON: %v", p.A, err)
			return false
		}
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 5000}); err != nil {
		t.Fatal(err)
	}
	if alike < 1000 || differ < 1000 {
		t.Fatalf("generator too one-sided: %d pairs alike, %d different", alike, differ)
	}
}
