package chaos

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestSoak runs three instances sharing one store (Redis, then MongoDB)
// under a bounded mixed load while a random instance is restarted every few
// seconds (SIGTERM, sometimes SIGKILL). `make soak` runs it for minutes
// (-soak=3m per store); `make test` runs about 10s per store.
//
// The load is plain bounded goroutines, not a load library such as vegeta:
// each logical request is a small state machine (its idempotency key, the
// payment id it got, retries with the same key through any instance,
// concurrent duplicates, a mismatching reuse after success), which a
// rate-driven attacker does not express, and open-loop load against
// instances being restarted would only measure refused connections.
//
// At the end, counted from the outside: every successful logical request
// was executed exactly once (one non-replayed 201, every replay with its
// payment id); executions summed over every instance incarnation equal the
// executions clients saw (201 executed, 502, 500) plus the executions lost
// with SIGKILLed instances, which are bounded by the requests those kills
// cut off; no record is left in progress; the test process's goroutines
// and heap are back to their baseline.
func TestSoak(t *testing.T) {
	dur := *soakFor
	if dur == 0 {
		dur = 10 * time.Second
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { soak(t, b.make(t), dur) })
	}
}

// logical request kinds and their share of the load, in percent
const (
	kindPay      = iota // 75%: a fresh payment, sometimes duplicated concurrently
	kindProvider        // 10%: amount 5000, the provider fails: 502, released, may execute again
	kindPanic           // 5%: amount 6000, the handler panics: 500, released, may execute again
	kindMismatch        // 10%: a payment, then its key reused with another amount: 422
)

type soakStats struct {
	logical, succeeded, duplicated          atomic.Int64
	executed201, replayed, provider, panics atomic.Int64
	conflicts, unavailable, mismatches      atomic.Int64
	refused, cutOff, gaveUp                 atomic.Int64
	restarts, kills                         atomic.Int64
	replayOnly                              atomic.Int64 // succeeded, but the client saw only replays
	maxTook                                 atomic.Int64
}

func soak(t *testing.T, be backend, dur time.Duration) {
	httpClient.CloseIdleConnections()
	leakOpts := goleak.IgnoreCurrent()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	// The store timeout stays below lease/3: a renewal that times out must
	// not outlast the lease (with -store-timeout 1s and -lease 1s, one slow
	// renewal under load lost the lease and a concurrent duplicate executed).
	const lease = 4 * time.Second // the floor: 4 × the store timeout
	args := append(be.flags(be.addr), "-charge-latency", "50ms", "-lease", lease.String(), "-store-timeout", "1s")
	insts := make([]*service, 3)
	for i := range insts {
		insts[i] = startService(t, "nethttp", "", args...)
	}
	urls := make([]string, len(insts))
	for i, s := range insts {
		urls[i] = s.URL // restarts keep the port
	}

	var st soakStats
	var finals atomic.Int64 // executions of finished incarnations
	deadline := time.Now().Add(dur)
	stopChaos := make(chan struct{})
	chaosDone := make(chan struct{})
	go func() { // restart a random instance every 1.5-3s
		defer close(chaosDone)
		for {
			select {
			case <-stopChaos:
				return
			case <-time.After(1500*time.Millisecond + rand.N(1500*time.Millisecond)):
			}
			s := insts[rand.N(len(insts))]
			if st.restarts.Load() == 1 || rand.N(10) < 3 { // the second restart is always a crash
				n, err := statsOf(s.URL) // a lower bound: what runs after this is lost with the process
				if err != nil {
					t.Errorf("stats before SIGKILL: %v", err)
				}
				s.kill()
				finals.Add(n)
				st.kills.Add(1)
			} else {
				finals.Add(s.stop())
			}
			st.restarts.Add(1)
			if err := s.restart(); err != nil {
				t.Errorf("restart: %v", err)
				return
			}
		}
	}()

	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 20 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			for n := 0; n < 100000 && time.Now().Before(deadline); n++ {
				soakOne(&st, urls, fail)
			}
		})
	}
	wg.Wait()
	close(stopChaos)
	<-chaosDone
	for _, s := range insts {
		finals.Add(s.stop())
	}
	for _, f := range failures {
		t.Error(f)
	}
	events := map[string]int{}
	for _, s := range insts {
		l := s.logs()
		for _, ev := range []string{"complete failed", "lease lost", "lease renewal failed", "release failed", "acquire failed"} {
			events[ev] += strings.Count(l, ev)
		}
	}
	t.Logf("%s: engine events logged by the instances: %v", be.name, events)

	total := finals.Load()
	observed := st.executed201.Load() + st.provider.Load() + st.panics.Load()
	lost := total - observed
	t.Logf("%s soak %v: %d logical requests (%d succeeded, %d duplicated concurrently); answers: %d 201 executed, %d replays, %d 502, %d 500 (panic), %d 409, %d 503, %d 422; %d refused connections, %d cut off by SIGKILL; %d gave up; %d restarts (%d SIGKILL); slowest answer %v",
		be.name, dur, st.logical.Load(), st.succeeded.Load(), st.duplicated.Load(), st.executed201.Load(), st.replayed.Load(),
		st.provider.Load(), st.panics.Load(), st.conflicts.Load(), st.unavailable.Load(), st.mismatches.Load(),
		st.refused.Load(), st.cutOff.Load(), st.gaveUp.Load(), st.restarts.Load(), st.kills.Load(), time.Duration(st.maxTook.Load()).Round(time.Millisecond))
	t.Logf("%s executions: %d counted by the instances = %d successes + %d provider errors + %d panics (5xx may execute again) + %d lost with SIGKILLed instances (of which %d successes whose answer was lost, the client got their replay)",
		be.name, total, st.executed201.Load(), st.provider.Load(), st.panics.Load(), lost, st.replayOnly.Load())
	if st.executed201.Load()+st.replayOnly.Load() != st.succeeded.Load() {
		t.Errorf("%d executed 201s and %d successes seen only as replays for %d successful logical requests",
			st.executed201.Load(), st.replayOnly.Load(), st.succeeded.Load())
	}
	if lost < 0 || lost > st.cutOff.Load() {
		t.Errorf("executions counted %d, seen by clients %d: %d unaccounted, %d requests cut off by SIGKILL", total, observed, lost, st.cutOff.Load())
	}
	if st.kills.Load() == 0 && lost != 0 {
		t.Errorf("no SIGKILL, yet %d executions unaccounted", lost)
	}
	if st.gaveUp.Load() > 0 {
		t.Errorf("%d logical requests got no final answer", st.gaveUp.Load())
	}
	if st.succeeded.Load() == 0 || st.restarts.Load() == 0 {
		t.Errorf("no load or no restarts")
	}

	time.Sleep(lease + 200*time.Millisecond)
	stuck, records := be.inProgress(t)
	if stuck != 0 {
		t.Errorf("%d of %d records in progress one lease after the load", stuck, records)
	}

	httpClient.CloseIdleConnections()
	goleak.VerifyNone(t, leakOpts)
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("%s: %d records; test process heap %d KiB before, %d KiB after", be.name, records, before.HeapAlloc>>10, after.HeapAlloc>>10)
	if after.HeapAlloc > before.HeapAlloc+32<<20 {
		t.Errorf("heap grew from %d to %d bytes", before.HeapAlloc, after.HeapAlloc)
	}
}

// soakOne plays one logical request to its end.
func soakOne(st *soakStats, urls []string, fail func(string, ...any)) {
	st.logical.Add(1)
	user, key := "u"+hexID(), newKey()
	kind, amount := kindPay, 100+rand.N(900)
	switch r := rand.N(100); {
	case r < 10:
		kind, amount = kindProvider, 5000
	case r < 15:
		kind, amount = kindPanic, 6000
	case r < 25:
		kind = kindMismatch
	}
	copies := 1
	if kind == kindPay && rand.N(4) == 0 {
		copies = 2
		st.duplicated.Add(1)
	}
	results := make([]answer, copies)
	var wg sync.WaitGroup
	for c := range copies {
		wg.Go(func() { results[c] = attempt(st, urls, user, key, amount) })
	}
	wg.Wait()
	id := ""
	for _, a := range results {
		switch {
		case a.status == 0:
			st.gaveUp.Add(1)
			return
		case kind == kindProvider && a.status != http.StatusBadGateway,
			kind == kindPanic && a.status != http.StatusInternalServerError,
			(kind == kindPay || kind == kindMismatch) && a.status != http.StatusCreated:
			fail("amount %d: final answer %v", amount, a)
			return
		case a.status == http.StatusCreated:
			if id != "" && a.id != id {
				fail("DOUBLE EXECUTION: key answered with payments %s and %s", id, a.id)
			}
			id = a.id
		}
	}
	if id != "" {
		st.succeeded.Add(1)
		executed := false
		for _, a := range results {
			executed = executed || !a.replayed
		}
		if !executed { // executed by an instance killed before it answered
			st.replayOnly.Add(1)
		}
	}
	if kind == kindMismatch {
		a := attempt(st, urls, user, key, amount+1)
		if a.status != http.StatusUnprocessableEntity {
			fail("key reused with another amount: %v, want 422", a)
		}
	}
}

// attempt sends the request through random instances until it gets a final
// answer (not 409, not 503, not a transport error), for at most a minute: a
// loaded machine makes the store slow (503s for seconds), which is not a
// fault; a request without a final answer after a minute is.
func attempt(st *soakStats, urls []string, user, key string, amount int) answer {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		a := pay(urls[rand.N(len(urls))], user, key, amount)
		if took := int64(a.took); took > st.maxTook.Load() {
			st.maxTook.Store(took)
		}
		switch {
		case a.err != nil:
			if errors.Is(a.err, syscall.ECONNREFUSED) {
				st.refused.Add(1) // instance restarting: never reached it
			} else {
				st.cutOff.Add(1) // the instance died or stopped under the request
			}
		case a.status == http.StatusConflict:
			st.conflicts.Add(1)
		case a.status == http.StatusServiceUnavailable:
			st.unavailable.Add(1)
		default:
			switch {
			case a.status == http.StatusCreated && a.replayed:
				st.replayed.Add(1)
			case a.status == http.StatusCreated:
				st.executed201.Add(1)
			case a.status == http.StatusBadGateway:
				st.provider.Add(1)
			case a.status == http.StatusInternalServerError:
				st.panics.Add(1)
			case a.status == http.StatusUnprocessableEntity:
				st.mismatches.Add(1)
			}
			return a
		}
		time.Sleep(50*time.Millisecond + rand.N(100*time.Millisecond))
	}
	return answer{}
}
