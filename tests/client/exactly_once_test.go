package client

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	tpclient "github.com/Shopify/toxiproxy/v2/client"

	"github.com/idemkit/idem/client/idemclient"
)

const (
	payments    = 20 // logical payments per framework, store and client
	workers     = 10
	maxAttempts = 20 // with ~45% of attempts faulted, P(a payment fails every attempt) ≈ 0.45^20 ≈ 1e-7
)

// outcome is what the caller of one logical payment learned.
type outcome struct {
	amount   int64 // requested
	status   int
	got      int64 // amount of the 201
	id       string
	replayed bool
	attempts int
	err      error
}

// newKeyPerAttempt is the naive client's mistake: it gives every attempt a
// fresh key, so that the server sees each retry as a new payment.
type newKeyPerAttempt struct{ base http.RoundTripper }

func (n newKeyPerAttempt) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(idemclient.HeaderKey, rand.Text())
	return n.base.RoundTrip(req)
}

// newClient returns the client under test: idemclient, or with naive the
// same retries (same transport, same attempts, same waits) with a new key
// per attempt. Keep-alives are off so that each attempt opens a connection
// of its own, on which toxiproxy rolls its dice anew.
// The faults each attempt met are counted in faults.
func newClient(naive bool, faults *faultCount) *http.Client {
	var base http.RoundTripper = &http.Transport{DisableKeepAlives: true}
	if naive {
		base = newKeyPerAttempt{base}
	}
	return &http.Client{Transport: idemclient.New(
		idemclient.WithBase(base),
		idemclient.WithAttemptHook(faults.add),
		idemclient.WithMaxAttempts(maxAttempts),
		idemclient.WithBackoff(20*time.Millisecond, 300*time.Millisecond),
		idemclient.WithAttemptTimeout(700*time.Millisecond),
		idemclient.WithResponseBuffer(64<<10), // a reply cut inside its body is retried too
		idemclient.WithMaxElapsed(90*time.Second),
	)}
}

// faultCount counts attempts by what they met.
type faultCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *faultCount) add(a idemclient.Attempt) {
	kind := "answered"
	switch {
	case a.Err == nil && a.Response.StatusCode == http.StatusConflict:
		kind = "409"
	case a.Err == nil:
	case errors.Is(a.Err, context.DeadlineExceeded):
		kind = "late"
	case strings.Contains(a.Err.Error(), "reading the response body"):
		kind = "cut body"
	case errors.Is(a.Err, syscall.ECONNRESET):
		kind = "reset"
	default:
		kind = "cut" // inside the status line or headers
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[kind]++
}

func (f *faultCount) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("answered %d, 409 %d, reset %d, cut %d, cut body %d, late %d",
		f.n["answered"], f.n["409"], f.n["reset"], f.n["cut"], f.n["cut body"], f.n["late"])
}

// pay sends one logical payment of amount (minor units) for user.
func pay(c *http.Client, url, user string, amount int64) outcome {
	o := outcome{amount: amount}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // hang guard
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/payments",
		strings.NewReader(fmt.Sprintf(`{"amount":%d,"currency":"eur"}`, amount)))
	if err != nil {
		o.err = err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", user)
	resp, err := c.Do(req)
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	o.status, o.replayed, o.attempts = resp.StatusCode, idemclient.Replayed(resp), idemclient.Attempts(resp)
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		o.err = fmt.Errorf("reading the %d's body: %w", resp.StatusCode, err)
		return o
	}
	var p struct {
		ID     string `json:"id"`
		Amount int64  `json:"amount"`
	}
	if o.status == http.StatusCreated {
		if err := json.Unmarshal(b, &p); err != nil {
			o.err = fmt.Errorf("201 body %q: %w", b, err)
		}
		o.id, o.got = p.ID, p.Amount
	}
	return o
}

// run starts framework with store behind a faulty proxy, sends the logical
// payments through a client, stops the service and returns its executions.
func run(t *testing.T, framework, store string, naive bool) (int64, []outcome, *faultCount) {
	svc := startService(t, framework, "-store", store, "-redis-url", redisURL(),
		"-redis-prefix", "idem-client-e2e:"+rand.Text()[:10]+":", "-ttl", "2m", "-charge-latency", "20ms")
	px, url := newProxy(t, svc.URL)
	// Every fault hits a reply, after the payment executed: only the key
	// tells a retry from a new payment.
	addToxic(t, px, "reset", "reset_peer", 0.15, tpclient.Attributes{"timeout": 0})  // connection reset as the reply starts
	addToxic(t, px, "cut10", "limit_data", 0.15, tpclient.Attributes{"bytes": 10})   // reply cut inside its status line
	addToxic(t, px, "cut265", "limit_data", 0.15, tpclient.Attributes{"bytes": 265}) // reply cut inside its body (headers are 200 to 260 bytes)
	addToxic(t, px, "late", "latency", 0.1, tpclient.Attributes{"latency": 1500})    // reply later than the attempt timeout
	faults := &faultCount{}
	c := newClient(naive, faults)
	user := "u-" + rand.Text()[:8]
	out := make([]outcome, payments)
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				out[i] = pay(c, url, user, int64(1000+i))
			}
		})
	}
	for i := range payments {
		next <- i
	}
	close(next)
	wg.Wait()
	return svc.stop(), out, faults
}

// TestExactlyOnce: through resets, cut replies and late replies, N logical
// payments sent with idemclient execute exactly N times, each answered by
// the 201 of its own amount; a client retrying as often without a stable
// key executes more.
func TestExactlyOnce(t *testing.T) {
	for _, framework := range frameworks {
		for _, store := range []string{"memory", "redis"} {
			t.Run(framework+"/"+store, func(t *testing.T) {
				t.Parallel()
				t.Run("idemclient", func(t *testing.T) {
					t.Parallel()
					execs, out, faults := run(t, framework, store, false)
					ids := map[string]int64{}
					retried, replays, attempts := 0, 0, 0
					for _, o := range out {
						attempts += o.attempts
						if o.attempts > 1 {
							retried++
						}
						if o.replayed {
							replays++
						}
						if o.err != nil || o.status != http.StatusCreated || o.got != o.amount || o.id == "" {
							t.Errorf("payment of %d: status %d amount %d id %q err %v; want its own 201", o.amount, o.status, o.got, o.id, o.err)
							continue
						}
						if prev, dup := ids[o.id]; dup {
							t.Errorf("payments of %d and %d answered with the same id %s", prev, o.amount, o.id)
						}
						ids[o.id] = o.amount
					}
					if execs != payments {
						t.Errorf("%d executions for %d logical payments", execs, payments)
					}
					t.Logf("%d payments, %d executions, %d attempts (%v), %d retried, %d answered by a replay", payments, execs, attempts, faults, retried, replays)
				})
				t.Run("naive", func(t *testing.T) {
					t.Parallel()
					execs, out, faults := run(t, framework, store, true)
					failed := 0
					for _, o := range out {
						if o.err != nil || o.status != http.StatusCreated {
							failed++
						}
					}
					if execs <= payments {
						t.Errorf("naive client: %d executions for %d logical payments; the faults should have caused duplicates", execs, payments)
					}
					t.Logf("naive: %d payments, %d executions (%d duplicates), %d not answered 201; attempts: %v", payments, execs, execs-payments, failed, faults)
				})
			})
		}
	}
}
