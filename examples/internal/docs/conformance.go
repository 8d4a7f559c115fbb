package docs

import (
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/memstore"
)

// What the conformance suites' doc comments take as given: an adapter's
// mount and native functions, and the store under test.
var (
	mount    func(t *testing.T, m adaptertest.Mount) string
	native   func(t *testing.T, m adaptertest.NativeMount) string
	newStore = func(t *testing.T) idem.Store { return memstore.New() }
)

// TestBehaviour is core/adaptertest's doc comment, compiled (an exported
// function of this package, never run: it is in no _test.go file).
// doc: core/adaptertest/adaptertest.go
func TestBehaviour(t *testing.T) {
	adaptertest.Run(t, adaptertest.Config{Mount: mount, Native: native, NewStore: newStore})
}

// doc end

// TestConformance is core/storetest's doc comment, compiled (never run).
// doc: core/storetest/storetest.go
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) idem.Store { return newStore(t) })
}

// doc end
