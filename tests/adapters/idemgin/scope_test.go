package idemgin_test

import (
	"testing"

	"github.com/idemkit/idem/adapters/idemgin"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/tests/adapters/internal/client"
)

// An adapter built without a scope function for an engine without
// WithGlobalScope would answer 401 to every request: New refuses it, naming
// the fix.
func TestNewWithoutScopePanics(t *testing.T) {
	client.NewWithoutScopePanics(t, "idemgin", func(e *idem.Engine) { _ = idemgin.New(e) })
}
