// Package sim is a deterministic simulation of idem's protocol (tests
// only): several engine instances sharing one memstore, their recoverers,
// clients through [idem.Do] or the HTTP middleware (adapters/idemhttp, in
// process), an operator, and the faults a seed chooses, all in one
// testing/synctest bubble, so that leases, renewals every lease/3, store
// timeouts, backoffs and the recoverers' passes run on a virtual clock,
// with no real waiting and no dependence on the machine's speed.
//
//	go test ./tests/sim -run 'TestSim$'                        # make test: seeds 1-2000
//	go test ./tests/sim -run 'TestSim$' -sim.seeds=1000000     # make soak
//	go test ./tests/sim -run 'TestSim$' -v -sim.seed=123 -sim.trace  # replay one seed, with its story
//
// # One run
//
// A seed chooses 2-3 instances, 1-3 keys, 2-6 clients (on some seeds a
// client reuses a key with another payload, whose run ends in a
// [idem.Permanent] error), the rates of store faults and of crashes and
// stalls inside handlers, scheduled instance crashes, stalls and restarts,
// and whether an operator acts, and for each key its door: [idem.Do] (an
// [idem.Operation] with Recover) or POST /pay through idemhttp on an
// engine with [idem.WithRecovery] (recovered through [idem.HTTPRunner],
// the principal re-established with [idem.Engine.RecoveryPrincipal]). The
// operation journals a charge ([idem.Step], not Repeatable) and a mail
// (Repeatable), then answers their results. Virtual timeline: lease 4s,
// store timeout 1s; faults until 40s (then dead instances restart), clients
// retry until 70s, the operator acts until 100s, recoverers run until 180s,
// then the invariants are checked.
//
// Faults: each store call (through a wrapper that hides memstore's
// LocalStore, so the engine takes, renews and loses real leases) may fail
// before applying, fail after applying (the answer is lost), time out (it
// waits for its context's deadline) or be applied late, after the caller
// gave up, or crash its instance right after applying. At each point of the
// handler (before, inside and after each step's effect) the instance may
// crash (its handler goroutines stop for good, every later store call of
// the instance fails, its recoverer stops; the client's attempt is lost and
// it retries on another instance) or stall for 1-3 leases (its handlers,
// renewals, recoverer and store calls all freeze, then go on: the stalled
// holder then tries to write). The operator settles a step whose outcome is
// unknown with [idem.ResolveStep] as it truly went: done with its effect's
// value when the effect happened, not done when the run that started it is
// over without one; a step whose starter is only stalled is left alone.
//
// Every decision is drawn from the seed: per-actor math/rand/v2 streams,
// and, for decisions taken in goroutines the engine starts, a hash of the
// seed, the virtual time and the call, so that a run does not depend on
// which goroutine the Go scheduler runs first at one virtual instant.
// Store calls that meet at one virtual instant (an instance waking from a
// stall, calls sharing a deadline) are spread over the next microsecond by
// what they are. TestSimReplays plays seeds twice (20 in make test,
// -sim.replays; 1,500 checked) and compares the multiset of store calls
// (virtual time, call, key, outcome). A failing seed prints the
// command that replays it.
//
// # Invariants
//
// Checked on every store call (a shadow of each key, from the calls that
// succeeded):
//   - fencing: a write that succeeds (journal start and finish, recovery
//     payload, suspend, extend, complete, release) comes from the token
//     that holds the key, within its lease (or on the record it suspended
//     itself); no fenced-out holder ever writes;
//   - lease exclusivity: an acquire or a recoverer's claim takes a key
//     only from a holder whose lease ended (a renewal that succeeded
//     counts), never from one that suspended it (uncertain);
//   - a release (or resolve with nil) frees the key: no acquire is
//     refused and no recoverer claims it until it is acquired again;
//   - a completed record keeps its answer (the retention outlasts the run).
//
// Checked after the run:
//   - at most one run of a non-Repeatable step's effect per key, across
//     releases too (see the finding below);
//   - a record whose holder stopped is completed, recovered, parked
//     uncertain, or gone by the horizon (never left in progress), and,
//     when the operator acts, not left uncertain on a step it settles;
//   - every client's final answer equals the stored one (and a mismatch
//     only where a client used another payload); a stored charge is one
//     that happened. One exception is counted, not failed (-sim.strict
//     fails it): [idem.Do] answered its function's outcome although its
//     completion did not land (documented for stores without
//     transactions), and the record ended parked uncertain with exactly
//     that outcome journaled (an operator completes it).
//
// # Finding: a release after a journaled step (fixed)
//
// A store error on a later step's start (or any transient error the
// handler returns after a step ran) made [idem.Do] release the key, and
// the release deleted the journal with the steps done in it: the retry
// ran a non-Repeatable step again (the charge twice), about one seed in
// eleven. Seed 2 showed it with one fault: StartStep("mail") times out
// (and is applied late) after "charge" was journaled; the handler returns
// the error, the key was released, and the client's retry charged again.
// Two more paths did the same: the background release after an acquire
// that timed out but landed late as a takeover of a record with a journal
// (seed 11), and, in pgstore and mysqlstore, a unit whose completion
// rolled back. Now an execution in which a step finished is never
// released when it ends without an answer: its lease lapses at once and
// its journal is kept ([idem.EventAbandoned]), the background release
// keeps a journal it meets, and the retry replays the finished steps.
// The first check above fails on any repeat.
//
// # Mutation evidence
//
// Each bug below was put back, one at a time, into a scratch copy of
// memstore or core (never committed) and 1000 seeds run; the first
// failing seed and the invariant that caught it:
//
//	bug                                                   caught by (first failing seed)
//	FinishStep without the token check (unfenced write)   fencing (5)
//	StartStep without the token check                     fencing (5)
//	a claim that takes a live lease                       lease exclusivity (2)
//	a resolve that leaves the step started                operator settlement does not take (28)
//	a completion that overwrites a completed record       fencing (3)
//	a release that leaves the journal and claim           release frees the key (2)
//	an acquire that takes a suspended record over         lease exclusivity (31)
//	Lapsed stops listing a record once claimed            a stopped holder's record ends (200)
//	Extend answering nil without extending                lease exclusivity (79)
//	core: a takeover runs a started non-Repeatable step   at most one effect (31)
//	core: a lost completion taken as stored (landed)      missed
//	core: an end without an answer after a step releases  at most one effect (2)
//	core: a late acquire's background release (no check)  at most one effect (11)
//
// Missed: with a store without transactions, Do answers the handler's
// result whether or not its completion landed (documented), so the
// engine's check of a lost completion changes nothing a client can see.
// The store-specific bugs of issue 49 (mongostore and Redis scripts) do not
// exist in memstore; the rows above are their memstore analogues, and
// tests/model and tests/robustness check the real stores.
//
// # Cost
//
// A run makes about 235 store calls (100 to 500) over 180 virtual seconds
// and costs about 4.5 ms of CPU, 19 ms with -race (seeds 1-3000 and
// 1-2000, /usr/bin/time): make test's 2,000 seeds take about 38 s of CPU
// with -race, 35 s of wall time at a load average of 9 on 2 cores; make
// soak's million about 75 minutes of CPU, about 40 on 2 idle cores (43 s
// of CPU, 81 s of wall time at a load average of 11 after the finding's
// fix). Of 2,000 seeds, about 950 executions are abandoned with their
// journal (the finding above), about 175 effects are made by a stalled
// holder already fenced out (harmless: its step is found started, and
// the execution ends uncertain, or it was Repeatable), and 2 clients got
// an answer whose record ended parked (the exception above).
//
// # Limits
//
// synctest cannot host real network I/O, so the simulation drives [idem.Do]
// and the net/http middleware in process (httptest), over memstore; HTTP
// over sockets and the real stores are left to tests/model, tests/robustness and tests/chaos. Two
// goroutines runnable at one virtual instant still run in the Go
// scheduler's order; decisions do not depend on it, and the calls they make
// are spread as above, but two calls alike (the same call on the same key)
// at one instant are not ordered by the seed.
package sim
