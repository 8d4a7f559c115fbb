// Package adapters holds no code: its subdirectories are the tests of the
// adapters in adapters/ (one package per adapter, e.g. tests/adapters/idemgin
// tests github.com/idemkit/idem/adapters/idemgin). They live in this module,
// not in the adapters' own, so that memstore, goleak and the other test-only
// requirements stay out of the module graph of an application that imports
// an adapter (CONTRIBUTING.md, "Where tests live"). The package's own test,
// TestTwinsInStep, keeps the code the framework-major twins share
// (idemfiber and idemfiberv3, idemecho and idemechov5) the same.
package adapters
