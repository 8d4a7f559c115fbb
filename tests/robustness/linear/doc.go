// Package linear checks that every shared store's operations on one record
// are linearizable under faults: concurrent clients record histories of
// Acquire (with its takeover report), Complete, Release, Extend, Get, the
// step journal's StartStep, FinishStep, Suspend and Steps, recovery's
// SetRecovery and Claim, and the operator's ResolveStep (invocation,
// return, or "unknown" for a call whose reply was lost or timed out: it
// may take effect at any point after its invocation, or never) through an
// in-process toxiproxy that delays, blackholes, resets and throttles the
// connection in both directions, and across restarts of a Redis server
// the test starts itself; github.com/anishathalye/porcupine judges each
// history against a sequential model of one record (model_test.go).
//
// Every lease is an hour: a lease ends only when its holder lapses it
// explicitly (an Extend to a millisecond, then a wait past it; the lease's
// end is a call of the history), so no verdict depends on the machine's
// speed.
//
// The calls contend: few keys at a time (a key whose record completed is
// replaced by a new one), leases that lapse and are taken over or claimed,
// holders that go on with their token after a takeover (fenced off). The
// summary counts, apart from the total, the calls that met a record in
// progress or uncertain in porcupine's linearization, those that met a
// lapsed lease, the takeovers, the claims and the fenced calls.
//
// What the model accepts beyond the contract, each a store's behaviour
// found by these histories (model_test.go says where):
//   - pgstore (stale): a takeover racing another takeover and its holder's
//     lapse may report the holder before it as the one it took over from
//     (the acquire statement reads the previous holder in its snapshot;
//     its ON CONFLICT update takes the latest row version over). A wrong
//     report, not a double holder; open.
//   - redisstore (retries): a Claim whose reply was lost and that go-redis
//     sent again answers not claimed although its first attempt claimed:
//     the record is held by a claimant that does not know it until the
//     claim's lease lapses; open.
//   - mongostore (claims): a takeover cut off between its claim document
//     and its rewrite of the record answers Acquire and Claim from the
//     claim for the claim's lease, while Get, Steps and the journal see the
//     record as it was.
//
// Bugs put back one at a time (never committed) and found by the default
// run (6s per store): a Claim that takes a live lease (pgstore's due
// condition without the lapse), an unfenced FinishStep (pgstore, without
// the lease), a ResolveStep that leaves the step started (pgstore), a
// Redis takeover script resent over a suspended record; tests/model's
// journal_test.go lists what the journal model catches.
//
// A history porcupine finds not linearizable is written to
// testdata/found/ as JSON (replayable) and HTML (porcupine's
// visualisation); moved to testdata/histories/ it becomes a regression
// test (TestReplay).
//
// The package holds tests only; `make robustness` runs them for longer
// (-robust.duration).
package linear
