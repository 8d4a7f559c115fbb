package mysqlstore_test

import (
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
)

// TestRecoverer: an engine's Recoverer finishes stopped executions over MySQL (MariaDB).
func TestRecoverer(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	storetest.RunRecoverer(t, func(t *testing.T) idem.Store {
		s, _ := newStore(t, db)
		return s
	})
}
