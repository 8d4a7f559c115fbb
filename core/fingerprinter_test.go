package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
)

// jsonFP fingerprints body as JSON under f.
func jsonFP(f Fingerprinter, body string) string {
	return f.Fingerprint("POST", "/p", "", "application/json", []byte(body))
}

func TestJSONFingerprint(t *testing.T) {
	f := JSONFingerprint()
	base := `{"amount":1000,"currency":"eur","meta":{"a":[1,2,{"x":null}],"b":true}}`
	for name, body := range map[string]string{
		"member order": `{"currency":"eur","meta":{"b":true,"a":[1,2,{"x":null}]},"amount":1000}`,
		"whitespace":   " {\n\t\"amount\" : 1000 ,\r\n \"currency\":\"eur\",\"meta\":{ \"a\":[ 1 , 2 ,{\"x\" :null}],\"b\":true}}\n",
		"escapes":      `{"amount":1000,"\u0063urrency":"\u0065ur","meta":{"a":[1,2,{"x":null}],"b":true}}`,
	} {
		if jsonFP(f, body) != jsonFP(f, base) {
			t.Errorf("%s: another fingerprint", name)
		}
	}
	for name, body := range map[string]string{
		"number as written": `{"amount":1000.0,"currency":"eur","meta":{"a":[1,2,{"x":null}],"b":true}}`,
		"array order":       `{"amount":1000,"currency":"eur","meta":{"a":[2,1,{"x":null}],"b":true}}`,
		"value":             `{"amount":1000,"currency":"usd","meta":{"a":[1,2,{"x":null}],"b":true}}`,
		"string not number": `{"amount":"1000","currency":"eur","meta":{"a":[1,2,{"x":null}],"b":true}}`,
		"null not absent":   `{"amount":1000,"currency":"eur","meta":{"a":[1,2,{}],"b":true}}`,
		"nesting moved":     `{"amount":1000,"currency":"eur","meta":{"a":[1,2],"x":null,"b":true}}`,
		"long name":         `{"` + strings.Repeat("k", 125) + `":1}`,
	} {
		if jsonFP(f, body) == jsonFP(f, base) {
			t.Errorf("%s: same fingerprint", name)
		}
	}
	if got := jsonFP(f, base); !strings.HasPrefix(got, "json:") || len(got) != len("json:")+64 {
		t.Fatalf("fingerprint %q, want json: and 64 hex characters", got)
	}
	// Not JSON, a repeated name, too deep: byte for byte, never equal to a canonical form.
	for _, body := range []string{`{"a":1,}`, `{"a":1,"a":1}`, strings.Repeat("[", 1001) + strings.Repeat("]", 1001), `{"a":1} x`, `01`, ``, `"\ud800"x`} {
		if _, err := f.canon(nil, "application/json", []byte(body)); !errors.Is(err, ErrNotCanonical) {
			t.Errorf("%.20q: canonical form read it (%v)", body, err)
		}
		if jsonFP(f, body) == jsonFP(f, body+" ") {
			t.Errorf("%.20q: not compared byte for byte", body)
		}
	}
	if jsonFP(f, `{"a":1,"a":1}`) == jsonFP(f, `{"a":1}`) {
		t.Error("a repeated name fingerprints as the single member")
	}
	if jsonFP(f, strings.Repeat("[", 1000)+strings.Repeat("]", 1000)) != jsonFP(f, strings.Repeat("[", 1000)+strings.Repeat("]", 1000)+" ") {
		t.Error("1000 levels were not read as JSON")
	}
}

func TestJSONFingerprintFields(t *testing.T) {
	ex := JSONFingerprintExcluding("/sent_at", "/items/0/note", "/a~1b", "/t~0")
	base := `{"amount":1,"sent_at":"10:00","items":[{"sku":"x","note":"hi"},{"sku":"y","note":"z"}],"a/b":1,"t~":2}`
	same := `{"items":[{"note":"other","sku":"x"},{"sku":"y","note":"z"}],"amount":1,"t~":3,"a/b":9}`
	if jsonFP(ex, base) != jsonFP(ex, same) || jsonFP(ex, base) != jsonFP(ex, `{"amount":1,"items":[{"sku":"x"},{"sku":"y","note":"z"}]}`) {
		t.Error("excluded members changed the fingerprint")
	}
	for name, body := range map[string]string{
		"included member": `{"amount":2,"sent_at":"10:00","items":[{"sku":"x","note":"hi"},{"sku":"y","note":"z"}]}`,
		"other element":   `{"amount":1,"sent_at":"10:00","items":[{"sku":"x","note":"hi"},{"sku":"y","note":"CHANGED"}]}`,
		"element dropped": `{"amount":1,"items":[{"sku":"y","note":"z"}]}`,
	} {
		if jsonFP(ex, body) == jsonFP(ex, base) {
			t.Errorf("excluding: %s: same fingerprint", name)
		}
	}
	if exArr := JSONFingerprintExcluding("/1"); jsonFP(exArr, `[1,2,3]`) != jsonFP(exArr, `[1,9,3]`) || jsonFP(exArr, `[1,2,3]`) == jsonFP(exArr, `[1,3]`) {
		t.Error("an excluded array element must count as present, its value not")
	}

	only := JSONFingerprintOnly("/amount", "/customer/id", "/lines")
	a := `{"amount":1,"customer":{"id":"c1","name":"Ann"},"lines":[1,2],"sent_at":"x"}`
	for name, body := range map[string]string{
		"other members": `{"sent_at":"y","lines":[1,2],"customer":{"name":"Bob","id":"c1"},"amount":1,"extra":[{}]}`,
	} {
		if jsonFP(only, body) != jsonFP(only, a) {
			t.Errorf("only: %s: another fingerprint", name)
		}
	}
	for name, body := range map[string]string{
		"amount":      `{"amount":2,"customer":{"id":"c1","name":"Ann"},"lines":[1,2]}`,
		"nested":      `{"amount":1,"customer":{"id":"c2","name":"Ann"},"lines":[1,2]}`,
		"whole array": `{"amount":1,"customer":{"id":"c1","name":"Ann"},"lines":[2,1]}`,
		"absent":      `{"amount":1,"customer":{"name":"Ann"},"lines":[1,2]}`,
		"null":        `{"amount":1,"customer":{"id":null,"name":"Ann"},"lines":[1,2]}`,
		"not object":  `{"amount":1,"customer":"c1","lines":[1,2]}`,
	} {
		if jsonFP(only, body) == jsonFP(only, a) {
			t.Errorf("only: %s changed, same fingerprint", name)
		}
	}
	if jsonFP(only, `{"amount":1,"amount":1}`) == jsonFP(only, `{"amount":1}`) {
		t.Error("only: a repeated selected member fingerprints as one")
	}

	// Each configuration has its own ID; the pointer order does not matter.
	ids := map[string]string{}
	for name, f := range map[string]Fingerprinter{
		"json": JSONFingerprint(), "ex a": JSONFingerprintExcluding("/a"), "ex b": JSONFingerprintExcluding("/b"),
		"ex ab": JSONFingerprintExcluding("/a", "/b"), "only a": JSONFingerprintOnly("/a"), "multipart": MultipartFingerprint(), "form": FormFingerprint(),
	} {
		if other, dup := ids[f.ID()]; dup || !validFingerprintID(f.ID()) {
			t.Errorf("%s: id %q (also %s)", name, f.ID(), other)
		}
		ids[f.ID()] = name
	}
	if JSONFingerprintExcluding("/a", "/b").ID() != JSONFingerprintExcluding("/b", "/a").ID() {
		t.Error("the pointer order changed the ID")
	}
	if JSONFingerprintOnly("").ID() != "json-o"+JSONFingerprintOnly("").ID()[6:] || jsonFP(JSONFingerprintOnly(""), `{"b":1,"a":2}`)[6:] == "" {
		t.Error("only the whole body")
	}
	for _, f := range []Fingerprinter{JSONFingerprintExcluding("a"), JSONFingerprintExcluding(""), JSONFingerprintOnly("/a~2"), JSONFingerprintOnly("/~"),
		NewFingerprinter("Upper", appendBodyRaw), NewFingerprinter("", appendBodyRaw), NewFingerprinter("x", nil), NewFingerprinter(strings.Repeat("x", 33), appendBodyRaw)} {
		if _, err := New(newScriptStore(0), WithFingerprint(f)); err == nil {
			t.Errorf("New accepted the bad fingerprint function %q", f.ID())
		}
		if _, err := New(newScriptStore(0), WithRoute("POST", "/r", RouteFingerprint(f))); err == nil {
			t.Errorf("New accepted the bad route fingerprint function %q", f.ID())
		}
	}
}

func appendBodyRaw(dst []byte, _ string, body []byte) ([]byte, error) {
	return append(dst, body...), nil
}

// multipartBody writes fields as multipart/form-data with a random boundary.
func multipartBody(t testing.TB, fields [][3]string) (contentType string, body []byte) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for _, f := range fields {
		var part io.Writer
		var err error
		if f[1] != "" {
			part, err = w.CreateFormFile(f[0], f[1])
		} else {
			part, err = w.CreateFormField(f[0])
		}
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(part, f[2])
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return w.FormDataContentType(), b.Bytes()
}

func TestMultipartFingerprint(t *testing.T) {
	f := MultipartFingerprint()
	fields := [][3]string{{"amount", "", "10"}, {"doc", "a.pdf", "%PDF bytes"}, {"tag", "", "x"}, {"tag", "", "y"}}
	fp := func(fields [][3]string) string {
		ct, body := multipartBody(t, fields)
		return f.Fingerprint("POST", "/u", "", ct, body)
	}
	base := fp(fields)
	if !strings.HasPrefix(base, "multipart:") {
		t.Fatalf("fingerprint %q", base)
	}
	if fp(fields) != base {
		t.Error("another boundary changed the fingerprint")
	}
	if fp([][3]string{{"tag", "", "x"}, {"doc", "a.pdf", "%PDF bytes"}, {"tag", "", "y"}, {"amount", "", "10"}}) != base {
		t.Error("reordering distinct names changed the fingerprint")
	}
	for name, other := range map[string][][3]string{
		"content":     {{"amount", "", "11"}, {"doc", "a.pdf", "%PDF bytes"}, {"tag", "", "x"}, {"tag", "", "y"}},
		"file name":   {{"amount", "", "10"}, {"doc", "b.pdf", "%PDF bytes"}, {"tag", "", "x"}, {"tag", "", "y"}},
		"field name":  {{"amount", "", "10"}, {"file", "a.pdf", "%PDF bytes"}, {"tag", "", "x"}, {"tag", "", "y"}},
		"value order": {{"amount", "", "10"}, {"doc", "a.pdf", "%PDF bytes"}, {"tag", "", "y"}, {"tag", "", "x"}},
		"part added":  append(append([][3]string{}, fields...), [3]string{"extra", "", ""}),
	} {
		if fp(other) == base {
			t.Errorf("%s changed, same fingerprint", name)
		}
	}
	// Not multipart, or unreadable: byte for byte.
	ct, body := multipartBody(t, fields)
	for name, c := range map[string]struct {
		ct   string
		body []byte
	}{"no boundary": {"multipart/form-data", body}, "json": {"application/json", body}, "truncated": {ct, body[:len(body)-10]}} {
		if _, err := f.canon(nil, c.ct, c.body); !errors.Is(err, ErrNotCanonical) {
			t.Errorf("%s: read as multipart (%v)", name, err)
		}
	}
}

func TestFormFingerprint(t *testing.T) {
	f := FormFingerprint()
	const ct = "application/x-www-form-urlencoded"
	fp := func(body string) string { return f.Fingerprint("POST", "/f", "", ct, []byte(body)) }
	if fp("a=1&b=x+y") != fp("b=x%20y&a=%31") || !strings.HasPrefix(fp("a=1"), "form:") {
		t.Error("equal parsed values, another fingerprint")
	}
	if fp("a=1&a=2") == fp("a=2&a=1") || fp("a=1") == fp("a=2") {
		t.Error("other parsed values, same fingerprint")
	}
	if f.Fingerprint("POST", "/f", "", "application/json", []byte("a=1&b=2")) == f.Fingerprint("POST", "/f", "", "application/json", []byte("b=2&a=1")) {
		t.Error("a body of another media type was parsed as a form")
	}
}

// TestFingerprintChanged: records made by a function the engine knows are
// compared with it (byte-exact is always known); a record made by an
// unknown function answers 422 "fingerprint-changed", and its event says so.
func TestFingerprintChanged(t *testing.T) {
	store := newScriptStore(0)
	var kinds []EventKind
	newEngine := func(opts ...Option) *Engine {
		opts = append(opts, WithLogger(slog.New(slog.DiscardHandler)), WithEventHook(func(_ context.Context, ev Event) { kinds = append(kinds, ev.Kind) }))
		e, err := New(store, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	run := func(e *Engine, key, body string) *Response {
		t.Helper()
		x, resp := e.Begin(context.Background(), &Request{Method: "POST", Route: "/r", Path: "/r", ContentType: "application/json", Keys: []string{key}, Principal: "p", Body: []byte(body)})
		if x != nil {
			x.Finish(201, http.Header{})
			return &Response{Status: 201}
		}
		return resp
	}
	problemType := func(resp *Response) string {
		var p Problem
		_ = json.Unmarshal(resp.Body, &p)
		return strings.TrimPrefix(p.Type, ProblemTypeBase)
	}
	bytesEngine, jsonEngine := newEngine(), newEngine(WithFingerprint(JSONFingerprint()))
	knowing := newEngine(WithKnownFingerprints(JSONFingerprint()))
	excluding := newEngine(WithFingerprint(JSONFingerprintExcluding("/sent_at")))
	routed := newEngine(WithRoute("POST", "/r", RouteFingerprint(JSONFingerprint())), WithRoute("POST", "/other", RouteFingerprint(FormFingerprint())))

	// Old records (byte-exact) under a new JSON engine: compared byte for byte.
	run(bytesEngine, "old", `{"a":1,"b":2}`)
	if r := run(jsonEngine, "old", `{"a":1,"b":2}`); !r.IsReplay() {
		t.Fatalf("same bytes under the JSON engine: %d %s, want the replay", r.Status, r.Body)
	}
	if r := run(jsonEngine, "old", `{"b":2,"a":1}`); r.Status != 422 || problemType(r) != "key-reused" {
		t.Fatalf("reordered, stored byte-exact: %d %s, want 422 key-reused", r.Status, r.Body)
	}
	// New records (JSON) under an old-configuration engine: fingerprint-changed.
	run(jsonEngine, "new", `{"a":1,"b":2}`)
	kinds = nil
	if r := run(bytesEngine, "new", `{"a":1,"b":2}`); r.Status != 422 || problemType(r) != "fingerprint-changed" || len(kinds) != 1 || kinds[0] != EventFingerprintChanged {
		t.Fatalf("JSON record, byte-exact engine: %d %s events %v, want 422 fingerprint-changed", r.Status, r.Body, kinds)
	}
	if r := run(excluding, "new", `{"a":1,"b":2}`); r.Status != 422 || problemType(r) != "fingerprint-changed" {
		t.Fatalf("JSON record, excluding engine: %d %s, want 422 fingerprint-changed", r.Status, r.Body)
	}
	// An engine that knows JSON compares with it: reordered replays, changed is key-reused.
	if r := run(knowing, "new", `{"b":2, "a":1}`); !r.IsReplay() {
		t.Fatalf("reordered under a knowing engine: %d %s, want the replay", r.Status, r.Body)
	}
	if r := run(knowing, "new", `{"a":1,"b":3}`); r.Status != 422 || problemType(r) != "key-reused" {
		t.Fatalf("changed under a knowing engine: %d %s, want 422 key-reused", r.Status, r.Body)
	}
	// Same function, other request: key-reused.
	if r := run(jsonEngine, "new", `{"a":2}`); r.Status != 422 || problemType(r) != "key-reused" {
		t.Fatalf("changed under the JSON engine: %d %s, want 422 key-reused", r.Status, r.Body)
	}
	// Per route: /r uses JSON, so a reordered retry replays.
	run(routed, "routed", `{"a":1,"b":2}`)
	if r := run(routed, "routed", `{"b":2,"a":1}`); !r.IsReplay() {
		t.Fatalf("route fingerprint: %d %s, want the replay", r.Status, r.Body)
	}
	if got := store.recs[ScopedKey("p", "POST", "/r", "routed")].Fingerprint; !strings.HasPrefix(got, "json:") {
		t.Fatalf("route fingerprint stored %q", got)
	}
	if got := store.recs[ScopedKey("p", "POST", "/r", "old")].Fingerprint; got != Fingerprint("POST", "/r", "", "application/json", []byte(`{"a":1,"b":2}`)) {
		t.Fatalf("the default fingerprint is no longer the bare Fingerprint: %q", got)
	}
}

// FuzzJSONFingerprint: the canonical form reads exactly the valid JSON
// without repeated names (encoding/json is the oracle), and a body and its
// re-encoding by encoding/json (members sorted, compact, strings
// re-escaped, numbers kept as written) fingerprint alike.
func FuzzJSONFingerprint(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,false,null,"x\u00e9\ud83d\ude00"]}`, `[1.5e3,-0,0.1]`, `"\ud800"`, `{"a":{"a":1},"a ":2}`,
		"\"\xff\"", `{"a":1,"a":2}`, `{"":{"":[]}}`, `  7 `, `{"x":"<&>"}`, `[{"k":"\/"}]`} {
		f.Add([]byte(s))
	}
	c := JSONFingerprint()
	selective := []Fingerprinter{JSONFingerprintExcluding("/a", "/0/b", "/b/a"), JSONFingerprintOnly("/a", "/b/0", "/0")}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, err := c.canon(nil, "application/json", body)
		valid := json.Valid(body)
		if err == nil && !valid {
			t.Fatalf("%q: read as JSON, encoding/json says it is not", body)
		}
		for _, s := range selective { // the same reader: never stricter, never laxer about syntax
			_, serr := s.canon(nil, "application/json", body)
			if err == nil && serr != nil || serr == nil && !valid {
				t.Fatalf("%q: %s read it: %v; plain JSON: %v; valid: %v", body, s.ID(), serr, err, valid)
			}
		}
		if !valid {
			return
		}
		if err != nil {
			if !repeatsName(body) && !strings.HasPrefix(strings.TrimLeft(string(body), " \t\r\n"), strings.Repeat("[", maxJSONDepth)) && bytes.Count(body, []byte("{"))+bytes.Count(body, []byte("[")) <= maxJSONDepth {
				t.Fatalf("%q: valid JSON without repeated names not read: %v", body, err)
			}
			return
		}
		d := json.NewDecoder(bytes.NewReader(body))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if jsonFP(c, string(body)) != jsonFP(c, string(again)) {
			t.Fatalf("%q and its re-encoding %q fingerprint differently", body, again)
		}
	})
}

// repeatsName reports whether valid JSON repeats a member name in an object.
func repeatsName(body []byte) bool {
	d := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		names   map[string]bool
		wantKey bool
	}
	var stack []*frame
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.names != nil && top.wantKey {
			if s, ok := tok.(string); ok {
				if top.names[s] {
					return true
				}
				top.names[s] = true
				top.wantKey = false
				continue
			}
		}
		if top != nil && top.names != nil && !top.wantKey {
			top.wantKey = true // this token is a member's value (or starts it)
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{names: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
	}
}

// FuzzMultipartFingerprint: the same parts under two random boundaries
// fingerprint alike; a changed content does not.
func FuzzMultipartFingerprint(f *testing.F) {
	f.Add("amount", "", "10", "doc", "a.pdf", "%PDF")
	f.Add("a", "x\"y.txt", "", "a", "", "\r\n--")
	f.Fuzz(func(t *testing.T, n1, f1, c1, n2, f2, c2 string) {
		fields := [][3]string{{n1, f1, c1}, {n2, f2, c2}}
		c := MultipartFingerprint()
		ct, body := multipartBody(t, fields)
		ct2, body2 := multipartBody(t, fields)
		if _, err := c.canon(nil, ct, body); err != nil { // names mime/multipart cannot read back: byte for byte
			return
		}
		a, b := c.Fingerprint("POST", "/", "", ct, body), c.Fingerprint("POST", "/", "", ct2, body2)
		if a != b {
			t.Fatalf("%q: two boundaries, two fingerprints", fields)
		}
		fields[1][2] += "!"
		ct3, body3 := multipartBody(t, fields)
		if c.Fingerprint("POST", "/", "", ct3, body3) == a {
			t.Fatalf("%q: changed content, same fingerprint", fields)
		}
	})
}

// jsonBody returns a JSON object of about n bytes: payment-like members
// and an array of line items.
func jsonBody(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"amount":1000,"currency":"eur","sent_at":"2026-12-01T10:00:00Z","customer":{"id":"cus_123","name":"Ann \u00e9"},"lines":[`)
	for i := 0; b.Len() < n-40; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"sku-%d","qty":%d,"price":12.50,"note":"line %d"}`, i, i%7, i)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// BenchmarkFingerprinters measures each fingerprint function on a JSON
// body of 1 KiB and 16 KiB (multipart and form on bodies of the same
// size): ns/op divided by the size in KiB is the cost per KiB.
func BenchmarkFingerprinters(b *testing.B) {
	for _, kib := range []int{1, 16} {
		body := jsonBody(kib << 10)
		ct, mp := multipartBody(b, [][3]string{{"amount", "", "1000"}, {"doc", "a.json", string(body)}})
		form := []byte("amount=1000&currency=eur&note=" + strings.Repeat("x", len(body)-30))
		for _, c := range []struct {
			name string
			f    Fingerprinter
			ct   string
			body []byte
		}{
			{"bytes", BytesFingerprint(), "application/json", body},
			{"json", JSONFingerprint(), "application/json", body},
			{"json-excluding", JSONFingerprintExcluding("/sent_at", "/lines/0/note"), "application/json", body},
			{"json-only", JSONFingerprintOnly("/amount", "/customer/id"), "application/json", body},
			{"multipart", MultipartFingerprint(), ct, mp},
			{"form", FormFingerprint(), "application/x-www-form-urlencoded", form},
		} {
			b.Run(fmt.Sprintf("f=%s/kib=%d", c.name, kib), func(b *testing.B) {
				b.SetBytes(int64(len(c.body)))
				b.ReportAllocs()
				for b.Loop() {
					c.f.Fingerprint("POST", "/v1/payments", "", c.ct, c.body)
				}
			})
		}
	}
}
