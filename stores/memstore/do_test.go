package memstore_test

import (
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/memstore"
)

func TestDo(t *testing.T) {
	storetest.RunDo(t, func(t *testing.T) idem.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}
