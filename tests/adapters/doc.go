// Package adapters holds no code: its subdirectories are the tests of the
// adapters in adapters/ (one package per adapter, e.g. tests/adapters/idemgin
// tests github.com/idemkit/idem/adapters/idemgin). They live in this module,
// not in the adapters' own, so that memstore, goleak and the other test-only
// requirements stay out of the module graph of an application that imports
// an adapter (see the Release section of CONTRIBUTING.md).
package adapters
