package redisstore_test

import (
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
)

// TestRecoverer: an engine's Recoverer finishes stopped executions over Redis.
func TestRecoverer(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	storetest.RunRecoverer(t, func(t *testing.T) idem.Store {
		return redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
	})
}
