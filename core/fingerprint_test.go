package idem

import "testing"

func TestFingerprint(t *testing.T) {
	base := Fingerprint("POST", "/v1/payments", "a=1&b=2", "application/json", []byte(`{"amount":1}`))
	if len(base) != 64 {
		t.Fatalf("fingerprint %q is not 64 hex characters", base)
	}
	same := []string{
		Fingerprint("POST", "/v1/payments", "b=2&a=1", "application/json", []byte(`{"amount":1}`)),
		Fingerprint("POST", "/v1/payments", "a=1&&b=2", "application/json", []byte(`{"amount":1}`)),
		Fingerprint("POST", "/v1/payments", "a=1&b=2", "Application/JSON", []byte(`{"amount":1}`)),
	}
	for i, fp := range same {
		if fp != base {
			t.Errorf("equivalent request %d has another fingerprint", i)
		}
	}
	differ := map[string]string{
		"method":       Fingerprint("PATCH", "/v1/payments", "a=1&b=2", "application/json", []byte(`{"amount":1}`)),
		"path":         Fingerprint("POST", "/v1/refunds", "a=1&b=2", "application/json", []byte(`{"amount":1}`)),
		"query":        Fingerprint("POST", "/v1/payments", "a=1&b=3", "application/json", []byte(`{"amount":1}`)),
		"content type": Fingerprint("POST", "/v1/payments", "a=1&b=2", "text/plain", []byte(`{"amount":1}`)),
		"body":         Fingerprint("POST", "/v1/payments", "a=1&b=2", "application/json", []byte(`{"amount":2}`)),
		"boundaries":   Fingerprint("POST", "/v1/paymentsa=1&b=2", "", "application/json", []byte(`{"amount":1}`)),
		// one query pair less must not let the content type and body shift into its place
		"query count": Fingerprint("POST", "/v1/payments", "a=1", "b=2", append([]byte("\x10application/json"), `{"amount":1}`...)),
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

// FuzzFingerprint checks that pair order in the query never matters.
func FuzzFingerprint(f *testing.F) {
	f.Add("a=1", "b=2", "application/json", []byte("{}"))
	f.Add("", "x", "Text/Plain; charset=UTF-8", []byte{0, 1, 2})
	f.Fuzz(func(t *testing.T, p, q, ct string, body []byte) {
		a := Fingerprint("POST", "/p", p+"&"+q, ct, body)
		b := Fingerprint("POST", "/p", q+"&"+p, ct, body)
		if a != b {
			t.Fatalf("query %q&%q and %q&%q differ", p, q, q, p)
		}
	})
}
