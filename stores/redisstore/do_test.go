package redisstore_test

import (
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
)

func TestDo(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	storetest.RunDo(t, func(t *testing.T) idem.Store {
		return redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
	})
}
