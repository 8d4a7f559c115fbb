package chaos

import (
	"net/http"
	"testing"
	"time"
)

// TestKillMidHandler SIGKILLs the instance running a handler (it reached the
// provider: its /v1/stats says so) and retries through another instance
// sharing the store: 409 while the dead instance's lease is live, then
// exactly one execution once it lapses, within one lease of the kill.
// The killed execution is the one execution a crash can repeat: it reached
// the provider but never completed, so the retry must execute again.
func TestKillMidHandler(t *testing.T) {
	for _, b := range backends {
		for _, fw := range frameworkNames {
			t.Run(b.name+"/"+fw, func(t *testing.T) {
				t.Parallel()
				be := b.make(t)
				const lease = 2 * time.Second // the floor: 4 × the store timeout
				args := append(be.flags(be.addr), "-charge-latency", "2s", "-lease", lease.String(), "-store-timeout", "500ms")
				a := startService(t, fw, "", args...)
				bsvc := startService(t, fw, "", args...)
				user, key := "u"+hexID(), newKey()

				first := async(a.URL, user, key, 1000)
				a.waitExecutions(1) // in the provider: acquired, lease renewed every lease/3
				a.kill()
				killed := time.Now()
				if ans := <-first; ans.err == nil {
					t.Fatalf("the killed instance answered %v", ans)
				}

				answers := retryUntil(bsvc.URL, user, key, 1000, 50*time.Millisecond, lease+20*time.Second,
					func(a answer) bool { return a.status == http.StatusCreated || a.err != nil })
				won := answers[len(answers)-1]
				if won.status != http.StatusCreated || won.replayed {
					t.Fatalf("retries through the other instance ended with %v; all: %v", won, summary(answers))
				}
				for _, x := range answers[:len(answers)-1] {
					if x.status != http.StatusConflict {
						t.Fatalf("a retry while the lease was live got %v, want 409; all: %v", x, summary(answers))
					}
				}
				if len(answers) < 2 {
					t.Errorf("the first retry executed at once: the dead instance's lease was not live")
				}
				lapse := won.at.Sub(killed)
				// The lease was renewed at most lease/3 before the kill, so
				// it lives at least 2/3 of a lease after it (safety: never
				// earlier, however loaded the machine). Then a retry wins
				// once it lapses; the bound on that is generous (liveness:
				// retries on a loaded machine are slow, not wrong).
				if lapse < 2*lease/3 || lapse > lease+10*time.Second {
					t.Errorf("the key was taken over %v after the kill, want within (%v, %v]", lapse, 2*lease/3, lease+10*time.Second)
				}
				if n := bsvc.executions(); n != 1 {
					t.Errorf("the surviving instance executed %d times, want 1", n)
				}
				// A completion that hit a store blip twice lands from the
				// engine's background retry: 409 until then.
				replays := settle(bsvc.URL, user, key, 1000, 20*time.Second)
				replay := replays[len(replays)-1]
				if replay.status != http.StatusCreated || !replay.replayed || replay.id != won.id {
					t.Errorf("replay after the takeover: %v id %q, want 201 replayed id %q", replay, replay.id, won.id)
				}
				time.Sleep(lease) // the requirement: no key stuck past one lease
				if stuck, _ := be.inProgress(t); stuck != 0 {
					t.Errorf("%d records in progress one lease after the end", stuck)
				}
				t.Logf("%s/%s: killed mid-handler; retries: %v; taken over %v after the kill (lease %v); executions on the survivor: 1 (+1 lost with the killed instance)",
					be.name, fw, summary(answers), lapse.Round(time.Millisecond), lease)
				if n := bsvc.stop(); n != 1 {
					t.Errorf("survivor's final count %d, want 1", n)
				}
			})
		}
	}
}

// TestSlowHandlerKeepsLease runs a handler three times longer than the lease
// on one instance while duplicates hit it and a second instance: lease
// renewal keeps the key, every duplicate gets 409, and there is one
// execution.
func TestSlowHandlerKeepsLease(t *testing.T) {
	for _, b := range backends {
		for _, fw := range frameworkNames {
			t.Run(b.name+"/"+fw, func(t *testing.T) {
				t.Parallel()
				be := b.make(t)
				args := append(be.flags(be.addr), "-charge-latency", "5s", "-lease", "2s", "-store-timeout", "500ms")
				a := startService(t, fw, "", args...)
				bsvc := startService(t, fw, "", args...)
				user, key := "u"+hexID(), newKey()
				first := async(a.URL, user, key, 1000)
				a.waitExecutions(1)
				var dups []answer
				var ans answer
			loop:
				for i := 0; ; i++ {
					select {
					case ans = <-first:
						break loop
					case <-time.After(100 * time.Millisecond):
						url := a.URL
						if i%2 == 1 {
							url = bsvc.URL
						}
						dups = append(dups, pay(url, user, key, 1000))
					}
				}
				if ans.status != http.StatusCreated || ans.replayed {
					t.Fatalf("the slow request answered %v", ans)
				}
				for _, d := range dups {
					// The last duplicate may be sent after completion, just
					// before the first answer reaches the client: a replay.
					if d.status != http.StatusConflict && !(d.replayed && d.id == ans.id) {
						t.Errorf("a duplicate during the handler got %v, want 409", d)
					}
				}
				if len(dups) < 4 { // one every 100ms, unless the machine is slow: a few suffice
					t.Errorf("only %d duplicates were sent during a 5s handler", len(dups))
				}
				if n := a.executions() + bsvc.executions(); n != 1 {
					t.Errorf("executions %d, want 1", n)
				}
				if r := pay(bsvc.URL, user, key, 1000); !r.replayed || r.id != ans.id {
					t.Errorf("replay: %v id %q, want replayed %q", r, r.id, ans.id)
				}
				t.Logf("%s/%s: handler 5s, lease 2s: duplicates %v; executions 1", be.name, fw, summary(dups))
				a.stop()
				bsvc.stop()
			})
		}
	}
}

// TestStoreDownRecovers cuts the connection to the store (proxy disabled):
// every request gets 503 and nothing executes; when the store is back the
// same instances recover on their own, the keys refused during the outage
// execute once (never 409: nothing was acquired) and replay afterwards.
func TestStoreDownRecovers(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			be := b.make(t)
			px := newProxy(t, be.addr)
			const lease = 2 * time.Second
			a := startService(t, "nethttp", "", append(be.flags(px.Addr()), "-charge-latency", "100ms", "-lease", lease.String(), "-store-timeout", "500ms")...)
			user := "u" + hexID()
			warm := retryUntil(a.URL, user, newKey(), 1000, 100*time.Millisecond, be.recovery,
				func(a answer) bool { return a.status == http.StatusCreated })
			if w := warm[len(warm)-1]; w.status != http.StatusCreated {
				t.Fatalf("no request succeeded before the outage: %v", summary(warm))
			}

			px.disable()
			keys := make([]string, 5)
			for i := range keys {
				keys[i] = newKey()
				ans := pay(a.URL, user, keys[i], 1000)
				if ans.status != http.StatusServiceUnavailable {
					t.Fatalf("store down: %v, want 503", ans)
				}
				if ans.took > 10*time.Second { // fail fast: bounded by the store timeout (generous on a loaded machine)
					t.Errorf("store down: 503 after %v", ans.took)
				}
			}
			if n := a.executions(); n != 1 {
				t.Fatalf("store down: executions %d, want 1 (the warm-up)", n)
			}

			px.enable()
			back := time.Now()
			ids := map[string]string{}
			var recovered time.Duration
			for i, k := range keys {
				as := retryUntil(a.URL, user, k, 1000, 100*time.Millisecond, be.recovery,
					func(a answer) bool { return a.status != http.StatusServiceUnavailable })
				last := as[len(as)-1]
				if last.status != http.StatusCreated || last.replayed {
					t.Fatalf("key %d after recovery: %v (all %v), want 201 executed: the outage must not leave the key acquired", i, last, summary(as))
				}
				ids[k] = last.id
				if i == 0 {
					recovered = time.Since(back)
				}
			}
			if n := a.executions(); n != int64(1+len(keys)) {
				t.Errorf("executions %d, want %d", n, 1+len(keys))
			}
			for k, id := range ids {
				if r := pay(a.URL, user, k, 1000); !r.replayed || r.id != id {
					t.Errorf("replay after recovery: %v id %q, want %q", r, r.id, id)
				}
			}
			time.Sleep(lease) // no key stuck past one lease
			if stuck, _ := be.inProgress(t); stuck != 0 {
				t.Errorf("%d records in progress one lease after the end", stuck)
			}
			t.Logf("%s: store down: 5×503, 0 executions; recovered without restart %v after the store came back; 5 keys executed once each",
				be.name, recovered.Round(time.Millisecond))
			if n := a.stop(); n != int64(1+len(keys)) {
				t.Errorf("final count %d", n)
			}
		})
	}
}
