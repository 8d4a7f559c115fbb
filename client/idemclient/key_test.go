package idemclient_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idem/client/idemclient"
	idem "github.com/idemkit/idem/core"
)

func TestKey(t *testing.T) {
	k := idemclient.Key("user-1", "order-42")
	// Fixed forever: a process restarted on a newer version must re-send it.
	if golden := "d4e9789e-7c06-8293-b7c2-50b8c49f255f"; k != golden {
		t.Errorf("Key(user-1, order-42) = %s, want %s", k, golden)
	}
	if got, err := idem.ParseKey([]string{k}); err != nil || got != k {
		t.Errorf("idem.ParseKey(%q) = %q, %v", k, got, err)
	}
	if u, err := uuid.Parse(k); err != nil || u.Version() != 8 || len(k) != 36 {
		t.Errorf("%q: %v, version %v", k, err, u.Version())
	}
	if idemclient.Key("user-1", "order-42") != k {
		t.Error("Key is not deterministic")
	}
	distinct := map[string][]string{}
	for _, parts := range [][]string{{"ab", "c"}, {"a", "bc"}, {"abc"}, {"abc", ""}, {}, {""}, {"", ""}, {"user-1", "order-43"}, {"order-42", "user-1"}} {
		k := idemclient.Key(parts...)
		if prev, ok := distinct[k]; ok {
			t.Errorf("Key(%q) = Key(%q)", parts, prev)
		}
		distinct[k] = parts
		if _, err := idem.ParseKey([]string{k}); err != nil {
			t.Errorf("Key(%q) = %q fails idem.ParseKey: %v", parts, k, err)
		}
	}
}
