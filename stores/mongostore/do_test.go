package mongostore_test

import (
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mongostore"
)

func TestDo(t *testing.T) {
	c, _ := shared(t)
	storetest.RunDo(t, func(t *testing.T) idem.Store {
		s := mongostore.New(collection(t, c))
		t.Cleanup(func() { s.Close() })
		return s
	})
}
