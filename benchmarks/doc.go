// Package benchmarks holds idem's performance measurements: Go benchmarks
// (testing.B) of the middleware on every framework, the stores, scale,
// contention and end-to-end load, compared by cmd/report into RESULTS.md.
// The module is never published. Run them with `make bench`. The cases
// its benchmarks share (requests, keys, apps, driver, pairing) are in
// internal/harness.
package benchmarks
