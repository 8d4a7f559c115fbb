package sim

import (
	"flag"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

var (
	seedFlag    = flag.Uint64("sim.seed", 0, "replay this seed only (0: run -sim.seeds seeds)")
	seedsFlag   = flag.Int("sim.seeds", 2000, "how many seeds TestSim runs (make test: 2000; make soak: a million)")
	firstFlag   = flag.Uint64("sim.first", 1, "the first seed of -sim.seeds")
	traceFlag   = flag.Bool("sim.trace", false, "with -sim.seed: print the run's story (store calls applied, faults, crashes)")
	replaysFlag = flag.Int("sim.replays", 20, "how many seeds TestSimReplays plays twice")
	strictFlag  = flag.Bool("sim.strict", false, "also fail a client answered while its record ended parked uncertain with that answer journaled (Do answers although its completion did not land: documented for stores without transactions)")
)

// TestSim plays -sim.seeds seeded runs (or -sim.seed alone) and checks
// the invariants of the package doc after each. A failing seed prints the
// command that replays it.
func TestSim(t *testing.T) {
	first, n := *firstFlag, uint64(*seedsFlag)
	if *seedFlag != 0 {
		first, n = *seedFlag, 1
	}
	var next, failed, ops, abandoned, parked, fencedEffects atomic.Uint64
	next.Store(first)
	start := time.Now()
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				seed := next.Add(1) - 1
				if seed >= first+n || failed.Load() >= 5 {
					return
				}
				if done := seed - first; done > 0 && done%100000 == 0 {
					t.Logf("%d seeds in %v", done, time.Since(start).Round(time.Second))
				}
				var problems []string
				var summary string
				synctest.Test(t, func(t *testing.T) {
					w, p := runWorld(seed, *strictFlag, n == 1 && *traceFlag)
					if w.verbose {
						t.Log("story:\n" + strings.Join(w.lines, "\n"))
					}
					problems, summary = p, w.summary()
					ops.Add(uint64(w.ops))
					abandoned.Add(uint64(w.counts["abandoned"]))
					parked.Add(uint64(w.counts["client-answered-record-parked"]))
					fencedEffects.Add(uint64(w.counts["effect-by-fenced-holder"]))
				})
				if n == 1 {
					t.Logf("seed %d: %s", seed, summary)
				}
				if len(problems) > 0 {
					failed.Add(1)
					strict := ""
					if *strictFlag {
						strict = " -sim.strict"
					}
					t.Errorf("seed %d broke %d invariant(s):\n  %s\n  run: %s\n  replay: go test ./tests/sim -run 'TestSim$' -v -sim.seed=%d%s (-sim.trace prints its story)",
						seed, len(problems), strings.Join(problems, "\n  "), summary, seed, strict)
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	t.Logf("%d seeds in %v (%.0f/s), %d store calls (%.0f per run); executions abandoned with their journal (not released): %d; "+
		"effects by a stalled holder already fenced out: %d; clients answered while their record ended parked uncertain with that answer journaled: %d (these fail under -sim.strict)",
		n, d.Round(time.Millisecond), float64(n)/d.Seconds(), ops.Load(), float64(ops.Load())/float64(n), abandoned.Load(), fencedEffects.Load(), parked.Load())
}

// TestSimReplays checks that -sim.replays seeds replay exactly: the same store calls,
// at the same virtual times, with the same outcomes.
func TestSimReplays(t *testing.T) {
	for seed := uint64(1); seed <= uint64(*replaysFlag); seed++ {
		var traces [2]uint64
		var sums [2]string
		for i := range traces {
			synctest.Test(t, func(t *testing.T) {
				w, _ := runWorld(seed, false, false)
				traces[i], sums[i] = w.trace, w.summary()
			})
		}
		if traces[0] != traces[1] {
			t.Errorf("seed %d did not replay exactly:\n  %s\n  %s", seed, sums[0], sums[1])
		}
	}
}
