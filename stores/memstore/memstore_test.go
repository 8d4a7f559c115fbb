package memstore_test

import (
	"testing"

	"go.uber.org/goleak"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) idem.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestJournal(t *testing.T) {
	storetest.RunJournal(t, func(t *testing.T) idem.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestRecovery(t *testing.T) {
	storetest.RunRecovery(t, func(t *testing.T) idem.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestRecoverer(t *testing.T) {
	storetest.RunRecoverer(t, func(t *testing.T) idem.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}
