// Package linear checks that every shared store's operations on one record
// are linearizable under faults: concurrent clients record histories of
// Acquire, Complete, Release, Extend and Get (invocation, return, or
// "unknown" for a call whose reply was lost or timed out) through an
// in-process toxiproxy that delays, blackholes, resets and throttles the
// connection in both directions, and across restarts of a Redis server the
// test starts itself; github.com/anishathalye/porcupine judges each
// history against a sequential model of one record.
//
// A history porcupine finds not linearizable is written to
// testdata/found/ as JSON (replayable) and HTML (porcupine's
// visualisation); moved to testdata/histories/ it becomes a regression
// test (TestReplay).
//
// The package holds tests only; `make robustness` runs them for longer
// (-robust.duration).
package linear
