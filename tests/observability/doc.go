// Package observability holds no code: its subdirectories are the tests of
// the modules in observability/ (tests/observability/idemotel tests
// github.com/idemkit/idem/observability/idemotel). They live in this module,
// not in the published ones, so that memstore, goleak and the OpenTelemetry
// SDK the tests use stay out of the module graph of an application that
// imports idemotel (CONTRIBUTING.md, "Adding an adapter").
package observability
