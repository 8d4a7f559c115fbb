// Package benchmarks holds idem's performance measurements: Go benchmarks
// (testing.B) of the middleware on every framework, the stores, scale,
// contention and end-to-end load, compared by cmd/report into RESULTS.md.
// The module is never published. Run them with `make bench`. What it
// shares with benchmarks/peers (the Go peers, a module outside go.work;
// `make bench-peers`) is in internal/harness.
package benchmarks
