package idem

import (
	"os"
	"strings"
	"testing"
)

func TestTokenOwner(t *testing.T) {
	p := ownerPrefix()
	host, pid, ok := TokenOwner(p + "1")
	if !ok || pid != os.Getpid() || host == "" || strings.Contains(host, ":") {
		t.Fatalf("TokenOwner(%q) = %q, %d, %v", p+"1", host, pid, ok)
	}
	for _, tok := range []string{"", "abc", "h:x:y.1", ":1:r.1", "h:0:r.1", "RANDOMTEXT.1"} {
		if _, _, ok := TokenOwner(tok); ok {
			t.Errorf("TokenOwner(%q) ok, want not", tok)
		}
	}
}
