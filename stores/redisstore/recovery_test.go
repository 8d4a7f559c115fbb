package redisstore_test

import (
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
)

func TestRecovery(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	storetest.RunRecovery(t, func(t *testing.T) idem.Store {
		return redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
	})
}

// TestClusterRecovery runs the suite on Redis Cluster with a prefix
// without a hash tag (the recovery index in a slot of its own, apart from
// the records) and with one (every key in one slot).
func TestClusterRecovery(t *testing.T) {
	t.Parallel()
	c := newClusterClient(t)
	t.Run("Untagged", func(t *testing.T) {
		storetest.RunRecovery(t, func(t *testing.T) idem.Store {
			return redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
		})
	})
	t.Run("Tagged", func(t *testing.T) {
		storetest.RunRecovery(t, func(t *testing.T) idem.Store {
			p := newPrefix(t, c)
			return redisstore.New(c, redisstore.WithPrefix(p+"{"+p+"}:"))
		})
	})
}
