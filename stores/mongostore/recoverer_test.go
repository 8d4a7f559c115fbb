package mongostore_test

import (
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mongostore"
)

// TestRecoverer: an engine's Recoverer finishes stopped executions over the MongoDB wire (FerretDB).
func TestRecoverer(t *testing.T) {
	c, _ := shared(t)
	storetest.RunRecoverer(t, func(t *testing.T) idem.Store {
		s := mongostore.New(collection(t, c))
		t.Cleanup(func() { s.Close() })
		return s
	})
}
