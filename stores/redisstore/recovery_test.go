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
// the records) and with one (every key in one slot), each behind a
// history of 2,000 completed records (TestRecovery writes 10,000: the
// index is kept by the same scripts).
func TestClusterRecovery(t *testing.T) {
	t.Parallel()
	c := newClusterClient(t)
	t.Run("Untagged", func(t *testing.T) {
		storetest.RunRecovery(t, func(t *testing.T) idem.Store {
			return redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
		}, storetest.WithHistory(2_000))
	})
	t.Run("Tagged", func(t *testing.T) {
		storetest.RunRecovery(t, func(t *testing.T) idem.Store {
			p := newPrefix(t, c)
			return redisstore.New(c, redisstore.WithPrefix(p+"{"+p+"}:"))
		}, storetest.WithHistory(2_000))
	})
}
