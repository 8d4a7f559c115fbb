// Package linear checks that every shared store's operations on one record
// are linearizable under faults: concurrent clients record histories of
// Acquire (with its takeover report), Complete, Release, Extend, Get and
// the step journal's StartStep, FinishStep, Suspend and Steps
// (invocation, return, or "unknown" for a call whose reply was lost or
// timed out) through an in-process toxiproxy that delays, blackholes,
// resets and throttles the connection in both directions, and across
// restarts of a Redis server the test starts itself;
// github.com/anishathalye/porcupine judges each history against a
// sequential model of one record, which follows short leases by the
// calls' times (model_test.go).
//
// The calls contend: few keys at a time (a key whose record completed is
// replaced by a new one), short leases that lapse and are taken over,
// holders that go on with their token after a takeover (fenced off). The
// summary counts, apart from the total, the calls that met a record in
// progress or uncertain in porcupine's linearization, those that met a
// lapsed lease, the takeovers and the fenced calls.
//
// A history porcupine finds not linearizable is written to
// testdata/found/ as JSON (replayable) and HTML (porcupine's
// visualisation); moved to testdata/histories/ it becomes a regression
// test (TestReplay).
//
// The package holds tests only; `make robustness` runs them for longer
// (-robust.duration).
package linear
