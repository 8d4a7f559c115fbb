package main

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idemkit/idem/benchmarks/internal/payments"
)

// mixText describes the traffic of attack for RESULTS.md.
const mixText = "of every 10 requests 6 fresh (a new key), 1 duplicate (the previous fresh key again, sent at once by another worker: in flight or just done) and 3 replays (a key sent at least 4×workers+10 requests earlier)"

// result is one attack's outcome.
type result struct {
	requests              uint64
	rps                   float64
	p50, p99              time.Duration
	errors, conflicts     int
	duplicates, replays   int
	executions, keysTwice int64
	cpuPerReq             time.Duration // the server process's CPU time per request (0: not measured)
	codes                 map[string]int
	firstError            string
	fresh                 int
}

// mix is attack's targeter: fresh keys, duplicates and replays, with
// UUID-shaped 36-character keys (Fiber's built-in demands them) and one
// principal per run.
type mix struct {
	mu                         sync.Mutex
	url, user                  string
	n, max                     int
	lag                        int
	history                    []string
	fresh, duplicates, replays int
	prefix                     string
}

func newMix(url string, workers, max int) *mix {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &mix{url: url + payments.Route, user: "user_" + hex.EncodeToString(b[:]), max: max, lag: 4*workers + 10, prefix: hex.EncodeToString(b[:])}
}

func (m *mix) key(i int) string {
	s := strconv.FormatInt(int64(i), 16)
	for len(s) < 12 {
		s = "0" + s
	}
	return m.prefix + "-0000-4000-8000-" + s
}

func (m *mix) target(t *vegeta.Target) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.max > 0 && m.n >= m.max {
		return vegeta.ErrNoTargets
	}
	slot := m.n % 10
	m.n++
	var key string
	switch {
	case slot == 6 && len(m.history) > 0:
		key = m.history[len(m.history)-1]
		m.duplicates++
	case slot >= 7 && len(m.history) > m.lag+10:
		key = m.history[len(m.history)-1-m.lag-slot]
		m.replays++
	default:
		key = m.key(len(m.history))
		m.history = append(m.history, key)
		m.fresh++
	}
	amount := strconv.Itoa(100 + len(key)%7) // the same body for every copy of a key
	t.Method, t.URL = http.MethodPost, m.url
	t.Body = []byte(`{"amount":` + amount + `}`)
	t.Header = http.Header{"Content-Type": {"application/json"}, "X-User-Id": {m.user}, "Idempotency-Key": {key}}
	return nil
}

// attack runs workers closed-loop workers against url for d (or, with max
// > 0, for max requests) and measures the answers: 201 and 409 are
// expected, anything else (or a transport error) counts as an error.
func attack(url string, workers int, d time.Duration, max int) result {
	m := newMix(url, workers, max)
	w := uint64(workers)
	atk := vegeta.NewAttacker(vegeta.Workers(w), vegeta.MaxWorkers(w), vegeta.Connections(workers),
		vegeta.MaxConnections(workers), vegeta.KeepAlive(true), vegeta.Timeout(10*time.Second))
	var vm vegeta.Metrics
	r := result{codes: map[string]int{}}
	for res := range atk.Attack(m.target, vegeta.Rate{Freq: 0, Per: time.Second}, d, "load") {
		if res.Error == vegeta.ErrNoTargets.Error() {
			continue
		}
		vm.Add(res)
		switch res.Code { // vegeta also sets Error for a 4xx or 5xx
		case http.StatusCreated:
		case http.StatusConflict:
			r.conflicts++
		default:
			r.errors++
			if r.firstError == "" {
				r.firstError = strconv.Itoa(int(res.Code)) + " " + res.Error + " " + string(res.Body)
			}
		}
	}
	vm.Close()
	for k, v := range vm.StatusCodes {
		r.codes[k] = v
	}
	r.requests = vm.Requests
	if vm.Duration+vm.Wait > 0 {
		r.rps = float64(vm.Requests) / (vm.Duration + vm.Wait).Seconds()
	}
	r.p50, r.p99 = vm.Latencies.P50, vm.Latencies.P99
	m.mu.Lock()
	r.fresh, r.duplicates, r.replays = m.fresh, m.duplicates, m.replays
	m.mu.Unlock()
	return r
}
