package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"reflect"
	"testing"
)

func TestFingerprint(t *testing.T) {
	const q = "a=1&b=2&b=3"
	base := Fingerprint("POST", "/v1/payments", q, "application/json", []byte(`{"amount":1}`))
	if len(base) != 64 {
		t.Fatalf("fingerprint %q is not 64 hex characters", base)
	}
	same := map[string]string{
		"name order":     Fingerprint("POST", "/v1/payments", "b=2&b=3&a=1", "application/json", []byte(`{"amount":1}`)),
		"interleaved":    Fingerprint("POST", "/v1/payments", "b=2&a=1&b=3", "application/json", []byte(`{"amount":1}`)),
		"empty pair":     Fingerprint("POST", "/v1/payments", "a=1&&b=2&b=3&", "application/json", []byte(`{"amount":1}`)),
		"percent":        Fingerprint("POST", "/v1/payments", "%61=%31&b=2&%62=3", "application/json", []byte(`{"amount":1}`)),
		"media type":     Fingerprint("POST", "/v1/payments", q, "Application/JSON", []byte(`{"amount":1}`)),
		"plus and %20":   Fingerprint("POST", "/v1/payments", "a=1&b=2&b=3&c=x+y", "application/json", nil),
		"empty value":    Fingerprint("POST", "/v1/payments", "a=1&b=2&b=3&c=", "application/json", nil),
		"percent in key": Fingerprint("POST", "/v1/payments", "a=1&b=2&b=3&c%20d=1", "application/json", nil),
	}
	twins := map[string]string{
		"plus and %20":   Fingerprint("POST", "/v1/payments", "a=1&b=2&b=3&c=x%20y", "application/json", nil),
		"empty value":    Fingerprint("POST", "/v1/payments", "a=1&b=2&b=3&c", "application/json", nil),
		"percent in key": Fingerprint("POST", "/v1/payments", "a=1&b=2&b=3&c+d=1", "application/json", nil),
	}
	for name, fp := range same {
		want := base
		if tw, ok := twins[name]; ok {
			want = tw
		}
		if fp != want {
			t.Errorf("equivalent request (%s) has another fingerprint", name)
		}
	}
	differ := map[string]string{
		"method":       Fingerprint("PATCH", "/v1/payments", q, "application/json", []byte(`{"amount":1}`)),
		"path":         Fingerprint("POST", "/v1/refunds", q, "application/json", []byte(`{"amount":1}`)),
		"query":        Fingerprint("POST", "/v1/payments", "a=1&b=2&b=4", "application/json", []byte(`{"amount":1}`)),
		"value order":  Fingerprint("POST", "/v1/payments", "a=1&b=3&b=2", "application/json", []byte(`{"amount":1}`)), // a handler gets b = [3 2]
		"content type": Fingerprint("POST", "/v1/payments", q, "text/plain", []byte(`{"amount":1}`)),
		"body":         Fingerprint("POST", "/v1/payments", q, "application/json", []byte(`{"amount":2}`)),
		"boundaries":   Fingerprint("POST", "/v1/paymentsa=1&b=2&b=3", "", "application/json", []byte(`{"amount":1}`)),
		"escaped &":    Fingerprint("POST", "/v1/payments", "a=1%26b%3D2&b=3", "application/json", []byte(`{"amount":1}`)),
		// one query pair less must not let the content type and body shift into its place
		"query count": Fingerprint("POST", "/v1/payments", "a=1&b=2", "b=3", append([]byte("\x10application/json"), `{"amount":1}`...)),
	}
	for name, fp := range differ {
		if fp == base {
			t.Errorf("a different %s gave the same fingerprint", name)
		}
	}
}

func TestScopedKey(t *testing.T) {
	k := ScopedKey("alice", "POST", "/v1/payments", "k1")
	for name, other := range map[string]string{
		"principal": ScopedKey("bob", "POST", "/v1/payments", "k1"),
		"method":    ScopedKey("alice", "PATCH", "/v1/payments", "k1"),
		"route":     ScopedKey("alice", "POST", "/v1/refunds", "k1"),
		"key":       ScopedKey("alice", "POST", "/v1/payments", "k2"),
		"shifted":   ScopedKey("alic", "ePOST", "/v1/payments", "k1"),
	} {
		if other == k {
			t.Errorf("another %s gave the same scoped key", name)
		}
	}
	if k != ScopedKey("alice", "POST", "/v1/payments", "k1") || len(k) != 64 {
		t.Fatal("scoped key is not stable or not 64 hex characters")
	}
}

// FuzzFingerprint checks the query rule on arbitrary pairs: p&q and q&p
// fingerprint alike exactly when url.ParseQuery reads them alike; when
// either does not parse, different readings never fingerprint alike.
func FuzzFingerprint(f *testing.F) {
	f.Add("a=1", "b=2", "application/json", []byte("{}"))
	f.Add("a=1", "a=2", "application/json", []byte("{}"))
	f.Add("a=%zz", "b;c", "application/json", []byte("{}"))
	f.Add("", "x", "Text/Plain; charset=UTF-8", []byte{0, 1, 2})
	f.Fuzz(func(t *testing.T, p, q, ct string, body []byte) {
		x, y := p+"&"+q, q+"&"+p
		vx, errX := url.ParseQuery(x)
		vy, errY := url.ParseQuery(y)
		parsedAlike := reflect.DeepEqual(vx, vy)
		alike := Fingerprint("POST", "/p", x, ct, body) == Fingerprint("POST", "/p", y, ct, body)
		if errX == nil && errY == nil && alike != parsedAlike || !parsedAlike && alike {
			t.Fatalf("query %q and %q: parsed alike %v (errors %v, %v), fingerprints alike %v", x, y, parsedAlike, errX, errY, alike)
		}
	})
}

// BenchmarkFingerprint measures the fingerprint of a small JSON request by
// query shape: `go test -bench Fingerprint -benchmem` (allocations matter
// more than time here; the hash dominates).
func BenchmarkFingerprint(b *testing.B) {
	body := []byte(`{"amount":1000,"currency":"eur"}`)
	for _, q := range []struct{ name, query string }{
		{"none", ""},
		{"one", "expand=customer"},
		{"three", "expand=customer&expand=invoice&limit=10"},
		{"escaped", "q=caf%C3%A9+au+lait&tag=a%2Cb&limit=10"},
	} {
		b.Run(q.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Fingerprint("POST", "/v1/payments", q.query, "application/json", body)
			}
		})
	}
}

// appendHex must agree with encoding/hex for every byte value.
func TestAppendHex(t *testing.T) {
	for start := 0; start < 256; start += sha256.Size {
		var sum [sha256.Size]byte
		for i := range sum {
			sum[i] = byte(start + i)
		}
		if got, want := string(appendHex([]byte("x"), sum)), "x"+hex.EncodeToString(sum[:]); got != want {
			t.Fatalf("appendHex = %s, want %s", got, want)
		}
	}
}
