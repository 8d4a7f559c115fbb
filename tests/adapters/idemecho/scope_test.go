package idemecho_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idem/adapters/idemecho"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

// An adapter built without a scope function for an engine without
// WithGlobalScope would answer 401 to every request: New refuses it, naming
// the fix.
func TestNewWithoutScopePanics(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	e, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			p := fmt.Sprint(recover())
			if !strings.Contains(p, "idemecho.WithScope") || !strings.Contains(p, "idem.WithGlobalScope") {
				t.Fatalf("New without WithScope: panic %q; want one naming idemecho.WithScope and idem.WithGlobalScope", p)
			}
		}()
		idemecho.New(e)
	}()
	g, err := idem.New(store, idem.WithGlobalScope())
	if err != nil {
		t.Fatal(err)
	}
	_ = idemecho.New(g) // no principals declared: no scope needed
}
