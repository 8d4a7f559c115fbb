package storetest

import (
	"strings"
	"testing"

	idem "github.com/idemkit/idem/core"
)

// testFingerprintWithID: a fingerprint that carries its function's ID
// ([idem.Fingerprinter]: up to 32 characters, ':', 64 hex characters) is
// kept byte for byte through Acquire, Get and Complete, so the engine can
// tell which function made a record.
func testFingerprintWithID(t *testing.T, s idem.Store) {
	long := idem.NewFingerprinter(strings.Repeat("x", 32), func(dst []byte, _ string, body []byte) ([]byte, error) { return append(dst, body...), nil })
	for _, fp := range []string{
		idem.JSONFingerprintExcluding("/sent_at").Fingerprint("POST", "/p", "", "application/json", []byte(`{}`)),
		long.Fingerprint("POST", "/p", "", "application/json", []byte(`{}`)),
	} {
		key, tok := Key(), Token()
		mustAcquire(t, s, key, tok, fp, longLease)
		if rec, found := get(t, s, key); !found || rec.Fingerprint != fp {
			t.Fatalf("Get after Acquire: fingerprint %q, want %q", rec.Fingerprint, fp)
		}
		if rec, ok, err := s.Acquire(ctx(t), key, Token(), "other", longLease); err != nil || ok || rec.Fingerprint != fp {
			t.Fatalf("Acquire in progress = %q, %v, %v; want %q", rec.Fingerprint, ok, err, fp)
		}
		if err := s.Complete(ctx(t), key, tok, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
		if rec, ok, err := s.Acquire(ctx(t), key, Token(), "other", longLease); err != nil || ok || rec.Fingerprint != fp {
			t.Fatalf("Acquire completed = %q, %v, %v; want %q", rec.Fingerprint, ok, err, fp)
		}
	}
}
