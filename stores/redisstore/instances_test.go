package redisstore_test

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
)

// TestManyInstances runs 8 instances (in-process engines, each with its
// own go-redis client, behind their own loopback HTTP servers) sharing one
// Redis, and sends 1,000 logical requests, each as 4 concurrent copies (the
// request and 3 retries) to 4 different instances of a round-robin: every
// logical request executes exactly once, every other copy is answered 409
// (in progress) or with the replay of that execution. BenchmarkInstances
// (benchmarks module, make bench) measures throughput as instances grow.
func TestManyInstances(t *testing.T) {
	t.Parallel()
	const instances, logical, copies = 8, 1000, 4
	var prefix string
	var executions atomic.Int32
	var urls []string
	for i := range instances {
		c := newClient(t)
		if i == 0 {
			prefix = newPrefix(t, c)
		}
		e, err := idem.New(redisstore.New(c, redisstore.WithPrefix(prefix)))
		if err != nil {
			t.Fatal(err)
		}
		urls = append(urls, newInstance(t, e, &executions, 2*time.Millisecond).URL)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()

	var next atomic.Int64
	var mu sync.Mutex
	var originals, replays, conflicts int
	var wg sync.WaitGroup
	for range 16 { // 16 logical requests at a time, 64 HTTP requests
		wg.Go(func() {
			for {
				n := int(next.Add(1)) - 1
				if n >= logical {
					return
				}
				key, body := "order-"+storetest.Token(), fmt.Sprintf(`{"amount":%d}`, n)
				answers := make([]answer, copies)
				var cw sync.WaitGroup
				for j := range copies {
					cw.Go(func() {
						a, err := post(client, urls[(n*copies+j)%instances], key, body)
						if err != nil {
							t.Errorf("logical %d copy %d: %v", n, j, err)
						}
						answers[j] = a
					})
				}
				cw.Wait()
				var first string
				o, r, c := 0, 0, 0
				for _, a := range answers {
					switch {
					case a.status == 201 && !a.replayed:
						o++
						first = a.body
					case a.status == 201 && a.replayed:
						r++
					case a.status == 409:
						c++
					default:
						t.Errorf("logical %d: answered %d %q %q", n, a.status, a.problem, a.body)
					}
				}
				for _, a := range answers {
					if a.replayed && a.body != first {
						t.Errorf("logical %d: replay %q of another execution than %q", n, a.body, first)
					}
				}
				if o != 1 {
					t.Errorf("logical %d: %d first executions among %d copies", n, o, copies)
				}
				mu.Lock()
				originals, replays, conflicts = originals+o, replays+r, conflicts+c
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if got := executions.Load(); got != logical {
		t.Fatalf("%d executions for %d logical requests sent %d times each over %d instances", got, logical, copies, instances)
	}
	t.Logf("%d instances, %d logical requests × %d concurrent copies: %d executions, %d replays, %d conflicts (409)",
		instances, logical, copies, executions.Load(), replays, conflicts)
}
