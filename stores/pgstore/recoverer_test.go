package pgstore_test

import (
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
)

// TestRecoverer: an engine's Recoverer finishes stopped executions over PostgreSQL.
func TestRecoverer(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	storetest.RunRecoverer(t, func(t *testing.T) idem.Store {
		s, _ := newStore(t, pool)
		return s
	})
}
