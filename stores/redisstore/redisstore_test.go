package redisstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// conformance runs storetest against c, one random prefix per subtest.
func conformance(t *testing.T, c redis.UniversalClient, opts ...redisstore.Option) {
	storetest.Run(t, func(t *testing.T) idem.Store {
		return redisstore.New(c, append([]redisstore.Option{redisstore.WithPrefix(newPrefix(t, c))}, opts...)...)
	})
}

func TestConformance(t *testing.T) {
	t.Parallel()
	conformance(t, newClient(t))
}

func TestConformanceWithTimeout(t *testing.T) {
	t.Parallel()
	conformance(t, newClient(t), redisstore.WithTimeout(5*time.Second))
}

func TestClusterConformance(t *testing.T) {
	t.Parallel()
	conformance(t, newClusterClient(t))
}

// TestConformanceReplicated runs the suites against a private primary with
// one replica, completing under WithWaitReplicas(1, ...): the pipelined
// EVALSHA+WAIT path (of records with a step journal too), including the
// NOSCRIPT fallback on a fresh server.
func TestConformanceReplicated(t *testing.T) {
	t.Parallel()
	primary, _ := startReplicatedPair(t)
	c := redis.NewClient(&redis.Options{Addr: primary.addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	conformance(t, c, redisstore.WithWaitReplicas(1, time.Second))
	t.Run("Journal", func(t *testing.T) {
		storetest.RunJournal(t, func(t *testing.T) idem.Store {
			return redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)), redisstore.WithWaitReplicas(1, time.Second))
		})
	})
}

// startReplicatedPair starts a private primary and a replica of it and waits
// until the replica is online.
func startReplicatedPair(t *testing.T) (primary, replica *redisProc) {
	t.Helper()
	primary = startRedisT(t, freePort(t), "--repl-diskless-sync-delay", "0")
	host, port, _ := strings.Cut(primary.addr, ":")
	replica = startRedisT(t, freePort(t), "--replicaof", host, port)
	c := redis.NewClient(&redis.Options{Addr: primary.addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.Info(ctxT(t), "replication").Result()
		if err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online") {
			return primary, replica
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica of %s not online: %v\n%s", primary.addr, err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	primary, _ := startReplicatedPair(t)
	c := redis.NewClient(&redis.Options{Addr: primary.addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	hook := &countHook{}
	c.AddHook(hook)
	resp := []byte(`a response`)

	// One replica asked, one present: acknowledged, no error, one round trip.
	s1 := redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)), redisstore.WithWaitReplicas(1, time.Second))
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s1.Acquire(ctxT(t), key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	// On a fresh server the completion script is not cached yet: EVALSHA
	// fails with NOSCRIPT and the pipeline is sent again with EVAL. (A ping
	// pipeline first dials go-redis's separate pipeline connection pool.)
	if _, err := c.Pipelined(ctxT(t), func(p redis.Pipeliner) error { return p.Ping(ctxT(t)).Err() }); err != nil {
		t.Fatal(err)
	}
	hook.reset()
	if err := s1.Complete(ctxT(t), storetest.Key(), storetest.Token(), resp, time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete of an absent key = %v; want ErrNotOwner", err)
	}
	if got := hook.names(); len(got) != 2 || got[0] != "pipeline[evalsha wait]" || got[1] != "pipeline[eval wait]" {
		t.Fatalf("first Complete on a fresh server sent %v; want the EVALSHA pipeline, then the EVAL one", got)
	}
	hook.reset()
	if err := s1.Complete(ctxT(t), key, tok, resp, time.Hour); err != nil {
		t.Fatalf("Complete with 1 replica acknowledging: %v", err)
	}
	if n := hook.count(); n != 1 {
		t.Fatalf("Complete+WAIT took %d round trips (%v); want 1 pipeline", n, hook.names())
	}

	// Two asked, one present: ErrNotReplicated, yet the response is stored.
	s2 := redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)), redisstore.WithWaitReplicas(2, 100*time.Millisecond))
	key, tok = storetest.Key(), storetest.Token()
	if _, ok, err := s2.Acquire(ctxT(t), key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	start := time.Now()
	err := s2.Complete(ctxT(t), key, tok, resp, time.Hour)
	if !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Complete with 2 of 1 replicas = %v; want ErrNotReplicated", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("Complete returned after %v; WAIT should have waited its 100ms timeout", d)
	}
	rec, found, err := s2.Get(ctxT(t), key)
	if err != nil || !found || rec.State != idem.StateCompleted || !bytes.Equal(rec.Response, resp) {
		t.Fatalf("after ErrNotReplicated Get = %+v, %v, %v; want the completed record on the primary", rec, found, err)
	}
	// Not the owner: ErrNotOwner wins over the replica count.
	if err := s2.Complete(ctxT(t), key, tok, resp, time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("second Complete = %v; want ErrNotOwner", err)
	}
}

// TestClusterWaitReplicas checks the pipelined completion reaches the slot's
// master on a cluster without replicas: the record is completed and the
// missing replica is reported.
func TestClusterWaitReplicas(t *testing.T) {
	t.Parallel()
	c := newClusterClient(t)
	s := redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)), redisstore.WithWaitReplicas(1, 50*time.Millisecond))
	resp := []byte("x")
	for range 8 { // keys on several slots, so several masters
		key, tok := storetest.Key(), storetest.Token()
		if _, ok, err := s.Acquire(ctxT(t), key, tok, "fp", time.Minute); err != nil || !ok {
			t.Fatalf("Acquire = %v, %v", ok, err)
		}
		if err := s.Complete(ctxT(t), key, tok, resp, time.Hour); !errors.Is(err, redisstore.ErrNotReplicated) {
			t.Fatalf("Complete on a cluster without replicas = %v; want ErrNotReplicated", err)
		}
		if rec, found, err := s.Get(ctxT(t), key); err != nil || !found || rec.State != idem.StateCompleted {
			t.Fatalf("Get = %+v, %v, %v; want completed", rec, found, err)
		}
	}
}

// countHook counts round trips: one per command, one per pipeline.
type countHook struct {
	mu   sync.Mutex
	cmds []string
}

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd.FullName())
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.FullName()
		}
		h.add("pipeline[" + strings.Join(names, " ") + "]")
		return next(ctx, cmds)
	}
}

func (h *countHook) add(s string) {
	h.mu.Lock()
	h.cmds = append(h.cmds, s)
	h.mu.Unlock()
}

func (h *countHook) reset() { h.mu.Lock(); h.cmds = nil; h.mu.Unlock() }

func (h *countHook) count() int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.cmds) }

func (h *countHook) names() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.cmds...)
}

func request(key, body string) *idem.Request {
	return &idem.Request{Method: "POST", Path: "/v1/payments", ContentType: "application/json",
		Keys: []string{key}, Principal: "alice", Body: []byte(body)}
}

func TestRoundTrips(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	hook := &countHook{}
	c.AddHook(hook)
	e, err := idem.New(redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c))))
	if err != nil {
		t.Fatal(err)
	}
	execute := func(key, body string) {
		t.Helper()
		x, resp := e.Begin(ctxT(t), request(key, body))
		if x == nil {
			t.Fatalf("Begin(%s) = %+v; want execution", key, resp)
		}
		x.Write([]byte(`{"id":"pay_1"}`))
		x.Finish(201, http.Header{"Content-Type": {"application/json"}})
	}
	expect := func(what string, want int, f func()) {
		t.Helper()
		hook.reset()
		f()
		if n := hook.count(); n != want {
			t.Errorf("%s: %d round trips %v; want %d", what, n, hook.names(), want)
		} else {
			t.Logf("%s: %d round trip(s) %v", what, n, hook.names())
		}
	}
	// Warm-up: scripts loaded (EVALSHA succeeds), connection dialled.
	execute("warm-up", `{"amount":1}`)
	e.Begin(ctxT(t), request("warm-up", `{"amount":1}`))

	expect("first execution (Begin+Finish)", 2, func() { execute("k1", `{"amount":100}`) })
	expect("replay", 1, func() {
		if _, resp := e.Begin(ctxT(t), request("k1", `{"amount":100}`)); resp == nil || resp.Status != 201 || !resp.IsReplay() {
			t.Fatalf("replay = %+v", resp)
		}
	})
	expect("422 mismatch", 1, func() {
		if _, resp := e.Begin(ctxT(t), request("k1", `{"amount":999}`)); resp == nil || resp.Status != 422 {
			t.Fatalf("mismatch = %+v", resp)
		}
	})
	x, _ := e.Begin(ctxT(t), request("k2", `{"amount":5}`))
	if x == nil {
		t.Fatal("Begin k2: no execution")
	}
	// A record found in progress costs a PTTL for its LeaseLeft (the 409's Retry-After).
	expect("409 conflict", 2, func() {
		if _, resp := e.Begin(ctxT(t), request("k2", `{"amount":5}`)); resp == nil || resp.Status != 409 {
			t.Fatalf("conflict = %+v", resp)
		}
	})
	expect("Fail (release)", 1, x.Fail)
}

// newInstance serves POST /v1/payments through e, counting executions of the
// handler, which takes hold so duplicates overlap it.
func newInstance(t *testing.T, e *idem.Engine, executions *atomic.Int32, hold time.Duration) *httptest.Server {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		x, resp := e.Begin(r.Context(), &idem.Request{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
			ContentType: r.Header.Get("Content-Type"), Keys: r.Header.Values(e.Header()),
			Principal: r.Header.Get("X-Principal"), Body: body})
		if resp != nil {
			resp.Send(w)
			return
		}
		if x == nil {
			t.Errorf("request passed through unprotected")
			return
		}
		n := executions.Add(1)
		time.Sleep(hold)
		out := []byte(fmt.Sprintf(`{"id":"pay_%d"}`, n))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/v1/payments/pay_%d", n))
		x.Write(out)
		x.Finish(http.StatusCreated, w.Header())
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(out)
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

type answer struct {
	status     int
	replayed   bool
	body       string
	problem    string
	retryAfter string // the Retry-After header
}

// retryBudget is how long a test retries idem's retryable answers, as a
// client would: a hang guard sized for a loaded machine, not a speed check.
const retryBudget = 2 * time.Minute

// retryable reports whether a is an answer idem documents as retryable:
// 503 store-unavailable or 409 in-progress, each with Retry-After (a 409
// without it is operation-uncertain, for an operator).
func (a answer) retryable() bool {
	return (a.status == http.StatusServiceUnavailable || a.status == http.StatusConflict) && a.retryAfter != ""
}

// postRetrying posts like a client that retries idem's retryable answers
// (409 in progress; 503 when a store call outran the store timeout on a
// loaded machine) every 50ms for up to retryBudget; it returns the first
// other answer, or the transport's error, and the number of retries.
func postRetrying(client *http.Client, url, key, body string) (answer, int, error) {
	deadline := time.Now().Add(retryBudget)
	for retries := 0; ; retries++ {
		a, err := post(client, url, key, body)
		if err != nil || !a.retryable() || time.Now().After(deadline) {
			return a, retries, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func post(client *http.Client, url, key, body string) (answer, error) {
	req, err := http.NewRequest("POST", url+"/v1/payments", strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Principal", "alice")
	res, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{status: res.StatusCode, replayed: res.Header.Get(idem.ReplayedHeader) == "true", body: string(b),
		retryAfter: res.Header.Get("Retry-After")}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
		var p idem.Problem
		if err := json.Unmarshal(b, &p); err != nil {
			return answer{}, fmt.Errorf("problem body %q: %w", b, err)
		}
		a.problem = p.Type
	}
	return a, nil
}

// multiInstance sends 60 concurrent duplicates spread over three instances,
// each with its own client from newClient, each retrying 409s and 503s as
// documented, and checks exactly one execution and every other client
// answered its replay.
func multiInstance(t *testing.T, newClient func() redis.UniversalClient) {
	prefix := ""
	var executions atomic.Int32
	var urls []string
	for i := range 3 {
		c := newClient()
		if i == 0 {
			prefix = newPrefix(t, c)
		}
		// A store timeout no store call outruns on a loaded machine: a
		// completion that timed out would leave the key to a second
		// execution after the lease.
		e, err := idem.New(redisstore.New(c, redisstore.WithPrefix(prefix)),
			idem.WithLease(2*time.Minute), idem.WithStoreTimeout(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		urls = append(urls, newInstance(t, e, &executions, 100*time.Millisecond).URL)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: time.Minute}
	defer client.CloseIdleConnections()

	const n = 60
	key, body := "order-"+storetest.Token(), `{"amount":4200,"currency":"EUR"}`
	answers := make([]answer, n)
	var (
		wg      sync.WaitGroup
		retries atomic.Int32
	)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			time.Sleep(time.Duration(i%6) * 40 * time.Millisecond) // spread over 200ms: some during, some after the execution
			a, r, err := postRetrying(client, urls[i%3], key, body)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			answers[i] = a
			retries.Add(int32(r))
		}()
	}
	close(start)
	wg.Wait()

	if got := executions.Load(); got != 1 {
		t.Fatalf("%d executions for %d duplicates over 3 instances; want exactly 1", got, n)
	}
	var originals, replays int
	var original string
	for i, a := range answers {
		switch {
		case a.status == 201 && !a.replayed:
			originals++
			original = a.body
		case a.status == 201 && a.replayed:
			replays++
		default:
			t.Errorf("request %d (instance %d) answered %d %q %q; want 201 or its replay", i, i%3, a.status, a.problem, a.body)
		}
	}
	if originals != 1 {
		t.Fatalf("%d first-execution answers; want 1", originals)
	}
	for i, a := range answers {
		if a.replayed && a.body != original {
			t.Errorf("replay %d body %q; want the original %q", i, a.body, original)
		}
	}
	// Every instance replays the completed response afterwards.
	for i, u := range urls {
		a, err := post(client, u, key, body)
		if err != nil || a.status != 201 || !a.replayed || a.body != original {
			t.Errorf("instance %d after completion: %+v, %v; want 201 replay of %q", i, a, err, original)
		}
	}
	t.Logf("%d duplicates: 1 execution, %d replays after %d retried 409s and 503s", n, replays, retries.Load())
}

func TestMultiInstance(t *testing.T) {
	t.Parallel()
	multiInstance(t, func() redis.UniversalClient { return newClient(t) })
}

func TestClusterMultiInstance(t *testing.T) {
	t.Parallel()
	multiInstance(t, func() redis.UniversalClient { return newClusterClient(t) })
}

// TestOutage stops a private Redis under a running store and starts it
// again on the same port (storetest.RunOutage).
func TestOutage(t *testing.T) {
	t.Parallel()
	storetest.RunOutage(t, func(t *testing.T) storetest.Outage {
		port := freePort(t)
		srv := startRedisT(t, port)
		c := redis.NewClient(&redis.Options{Addr: srv.addr, ContextTimeoutEnabled: true,
			DialTimeout: 200 * time.Millisecond, MaxRetries: 1})
		t.Cleanup(func() { _ = c.Close() })
		return storetest.Outage{
			Store: redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c))),
			Cut:   srv.stop,
			Restore: func() {
				srv2, err := startRedis(binary(t, "redis-server"), port, t.TempDir())
				if err != nil {
					t.Fatalf("restart on port %d: %v", port, err)
				}
				t.Cleanup(srv2.stop)
			},
		}
	})
}

// TestCrashedOwnerLease: a process acquires and dies (no Finish, no
// renewal). Retries get 409 while its lease lives; after it lapses, exactly
// one of several concurrent retries executes.
func TestCrashedOwnerLease(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	prefix := newPrefix(t, c)
	store := redisstore.New(c, redisstore.WithPrefix(prefix))
	e, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"amount":7}`
	key := idem.ScopedKey("alice", "POST", "/v1/payments", "crash-1")
	fp := idem.Fingerprint("POST", "/v1/payments", "", "application/json", []byte(body))
	if _, ok, err := store.Acquire(ctxT(t), key, "crashed-process", fp, idem.DefaultLease); err != nil || !ok {
		t.Fatalf("crashed process Acquire = %v, %v", ok, err)
	}
	// The process is gone: nothing renews or finishes.
	if _, resp := e.Begin(ctxT(t), request("crash-1", body)); resp == nil || resp.Status != 409 {
		t.Fatalf("retry while the lease lives = %+v; want 409", resp)
	}
	// The lease lapses (set by hand, so that no check depends on how fast
	// this machine is).
	if err := c.PExpire(ctxT(t), prefix+key, time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); c.Exists(ctxT(t), prefix+key).Val() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the lapsed lease is still there after 10s")
		}
	}

	var executions, conflicts atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			x, resp := e.Begin(context.Background(), request("crash-1", body))
			switch {
			case x != nil:
				executions.Add(1)
				time.Sleep(50 * time.Millisecond)
				x.Write([]byte("done"))
				x.Finish(201, nil)
			case resp.Status == 409 || (resp.Status == 201 && resp.IsReplay()):
				conflicts.Add(1)
			default:
				t.Errorf("retry after the lease lapsed = %d %s", resp.Status, resp.Body)
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := executions.Load(); n != 1 {
		t.Fatalf("%d of 8 retries executed after the lease lapsed; want exactly 1", n)
	}
	if _, resp := e.Begin(ctxT(t), request("crash-1", body)); resp == nil || resp.Status != 201 || string(resp.Body) != "done" {
		t.Fatalf("retry after the takeover completed = %+v; want the replay", resp)
	}
	if _, err := c.Get(ctxT(t), "never-touched").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("sanity: %v", err)
	}
}

// TestLayout checks the documented key layout and TTLs.
func TestLayout(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	prefix := newPrefix(t, c)
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctxT(t), key, tok, "fp-1", 1500*time.Microsecond); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if _, ok, err := s.Acquire(ctxT(t), storetest.Key(), tok, "fp-1", time.Nanosecond); err != nil || !ok {
		t.Fatalf("Acquire with a 1ns lease (rounded up to 1ms) = %v, %v", ok, err)
	}
	key2, tok2 := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctxT(t), key2, tok2, "fp-2", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	v, err := c.Get(ctxT(t), prefix+key2).Result()
	if want := fmt.Sprintf("1%d:%s4:fp-2", len(tok2), tok2); err != nil || v != want {
		t.Fatalf("in-progress value = %q, %v; want %q ('1' lp(token) lp(fingerprint))", v, err, want)
	}
	if ttl, _ := c.PTTL(ctxT(t), prefix+key2).Result(); ttl <= 59*time.Second || ttl > time.Minute {
		t.Fatalf("in-progress TTL = %v; want the 1m lease", ttl)
	}
	resp := []byte{1, 0xc9, 0x01, 0, 0, 1, 0xff}
	if err := s.Complete(ctxT(t), key2, tok2, resp, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	v, _ = c.Get(ctxT(t), prefix+key2).Result()
	if want := "24:fp-2" + string(resp); v != want {
		t.Fatalf("completed value = %q; want %q ('2' lp(fingerprint) response, no token)", v, want)
	}
	if ttl, _ := c.PTTL(ctxT(t), prefix+key2).Result(); ttl <= 2*time.Hour-time.Minute || ttl > 2*time.Hour {
		t.Fatalf("completed TTL = %v; want the 2h retention", ttl)
	}
	time.Sleep(10 * time.Millisecond)
	if n, _ := c.Exists(ctxT(t), prefix+key).Result(); n != 0 {
		t.Fatal("a 1.5ms lease (2ms) still holds its key after 10ms")
	}
}

// TestCorruptRecords: foreign or damaged data under the prefix is an error,
// never a decision, and is left as it is: Acquire never overwrites it, and
// Complete, Release and Extend answer ErrNotOwner (no token owns it).
func TestCorruptRecords(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	prefix := newPrefix(t, c)
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	write := map[string]func(k string) error{
		"list": func(k string) error { return c.RPush(ctxT(t), k, "a", "b").Err() },
		"set":  func(k string) error { return c.SAdd(ctxT(t), k, "a").Err() },
		// Strings of the current layout.
		"foreign string": func(k string) error { return c.Set(ctxT(t), k, "a string", 0).Err() },
		"empty string":   func(k string) error { return c.Set(ctxT(t), k, "", 0).Err() },
		"unknown state":  func(k string) error { return c.Set(ctxT(t), k, "93:tok2:fp", 0).Err() },
		"token overruns": func(k string) error { return c.Set(ctxT(t), k, "199:tok2:fp", 0).Err() },
		"no fingerprint": func(k string) error { return c.Set(ctxT(t), k, "13:tok", 0).Err() },
		"trailing bytes": func(k string) error { return c.Set(ctxT(t), k, "13:tok2:fpX", 0).Err() },
		"leading zero":   func(k string) error { return c.Set(ctxT(t), k, "103:tok2:fp", 0).Err() },
		// After '1' lp("tok"), what Complete's owner check matches for the
		// token "tok" before it reads the rest as the fingerprint.
		"fingerprint leading zero": func(k string) error { return c.Set(ctxT(t), k, "13:tok02:fp", 0).Err() },
		"fingerprint overruns":     func(k string) error { return c.Set(ctxT(t), k, "13:tok9:fp", 0).Err() },
		"fingerprint short":        func(k string) error { return c.Set(ctxT(t), k, "13:tok1:fp", 0).Err() },
		"fingerprint no colon":     func(k string) error { return c.Set(ctxT(t), k, "13:tok2;fp", 0).Err() },
		"fingerprint no length":    func(k string) error { return c.Set(ctxT(t), k, "13:tok:fp", 0).Err() },
		"fingerprint 11 digits":    func(k string) error { return c.Set(ctxT(t), k, "13:tok10000000000:", 0).Err() },
		"bad response":             func(k string) error { return c.Set(ctxT(t), k, "22:fp\x07garbage", 0).Err() },
		"completed, no answer":     func(k string) error { return c.Set(ctxT(t), k, "22:fp", 0).Err() },
		"hash":                     func(k string) error { return c.HSet(ctxT(t), k, "s", "2", "f", "x").Err() },
	}
	for name, w := range write {
		t.Run(name, func(t *testing.T) {
			key := storetest.Key()
			k := prefix + key
			if err := w(k); err != nil {
				t.Fatal(err)
			}
			c.Expire(ctxT(t), k, time.Minute)
			dump := func() string { d, _ := c.Dump(ctxT(t), k).Result(); return d }
			before := dump()
			// A completed record whose response does not decode is handed
			// out as it is: the engine answers 500 unreadable. Anything
			// else is ErrCorrupt.
			corrupt := func(call string, rec idem.Record, err error) {
				t.Helper()
				if name == "bad response" {
					if _, derr := idem.DecodeResponse(rec.Response); err != nil || rec.State != idem.StateCompleted || derr == nil {
						t.Fatalf("%s = %+v, %v; want the completed record, its response not decoding", call, rec, err)
					}
				} else if !errors.Is(err, redisstore.ErrCorrupt) || !errors.Is(err, idem.ErrCorrupt) {
					t.Fatalf("%s = %+v, %v; want ErrCorrupt", call, rec, err)
				}
			}
			rec, _, err := s.Acquire(ctxT(t), key, "t", "fp", time.Minute)
			corrupt("Acquire", rec, err)
			rec, _, err = s.Get(ctxT(t), key)
			corrupt("Get", rec, err)
			info, _, err := s.Inspect(ctxT(t), key)
			corrupt("Inspect", info.Record, err)
			if (name == "list" || name == "set") && !strings.Contains(err.Error(), "a Redis "+name+",") {
				t.Fatalf("Inspect of a %s = %v; want ErrCorrupt naming the type", name, err)
			}
			for _, tok := range []string{"t", "tok", "tok2", ""} {
				if err := s.Complete(ctxT(t), key, tok, []byte("response"), time.Hour); !errors.Is(err, idem.ErrNotOwner) {
					t.Fatalf("Complete(%q) = %v; want ErrNotOwner", tok, err)
				}
				if err := s.Extend(ctxT(t), key, tok, time.Hour); !errors.Is(err, idem.ErrNotOwner) {
					t.Fatalf("Extend(%q) = %v; want ErrNotOwner", tok, err)
				}
				if err := s.Release(ctxT(t), key, tok); !errors.Is(err, idem.ErrNotOwner) {
					t.Fatalf("Release(%q) = %v; want ErrNotOwner", tok, err)
				}
			}
			if after := dump(); after != before {
				t.Fatalf("the store changed the value: DUMP %q, was %q", after, before)
			}
			if ttl := c.PTTL(ctxT(t), k).Val(); ttl <= 0 || ttl > time.Minute {
				t.Fatalf("TTL %v; want the minute it was given, untouched", ttl)
			}
		})
	}
}

// TestMemoryPerRecord reports MEMORY USAGE of a completed record holding a
// 200-byte JSON body, and bounds it.
func TestMemoryPerRecord(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	prefix := newPrefix(t, c)
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	key, tok := storetest.Key(), storetest.Token()
	fp := idem.Fingerprint("POST", "/v1/payments", "", "application/json", []byte("{}"))
	if _, ok, err := s.Acquire(ctxT(t), key, tok, fp, time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	inProgress, err := c.MemoryUsage(ctxT(t), prefix+key).Result()
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"id":"pay_1","amount":4200,"currency":"EUR","status":"succeeded","customer":"cus_123","description":"` +
		strings.Repeat("x", 200) + `"}`)[:200]
	enc := append([]byte("\x01\xc9\x01\x02\x0cContent-Type\x01\x10application/json\x08Location\x01\x12/v1/payments/pay_1"), body...) // the engine's encoding
	if err := s.Complete(ctxT(t), key, tok, enc, time.Hour); err != nil {
		t.Fatal(err)
	}
	completed, err := c.MemoryUsage(ctxT(t), prefix+key).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MEMORY USAGE: in-progress %d bytes; completed with a 200-byte body (%d-byte encoded response) %d bytes; key %d bytes",
		inProgress, len(enc), completed, len(prefix+key))
	if completed > 1024 || completed < int64(len(enc)) {
		t.Fatalf("completed record uses %d bytes; want between %d and 1024", completed, len(enc))
	}
}

func TestCancelledContextNoIO(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	hook := &countHook{}
	c.AddHook(hook)
	s := redisstore.New(c)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err1 := s.Acquire(ctx, storetest.Key(), "t", "f", time.Minute)
	err2 := s.Complete(ctx, storetest.Key(), "t", []byte("response"), time.Minute)
	err3 := s.Release(ctx, storetest.Key(), "t")
	err4 := s.Extend(ctx, storetest.Key(), "t", time.Minute)
	_, _, err5 := s.Get(ctx, storetest.Key())
	for i, err := range []error{err1, err2, err3, err4, err5} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("call %d with a cancelled context = %v; want context.Canceled", i, err)
		}
	}
	if n := hook.count(); n != 0 {
		t.Fatalf("cancelled calls sent %d commands %v; want none", n, hook.names())
	}
}

func TestWithTimeout(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	// WAIT for a replica that does not exist blocks for its 1s timeout; the
	// store's 100ms operation timeout ends the call first.
	prefix := newPrefix(t, c)
	s := redisstore.New(c, redisstore.WithPrefix(prefix),
		redisstore.WithTimeout(100*time.Millisecond), redisstore.WithWaitReplicas(5, time.Second))
	key, tok := storetest.Key(), storetest.Token()
	// Acquired without the 100ms bound: on a loaded machine the first
	// command (which may dial a connection) may take longer.
	if _, ok, err := redisstore.New(c, redisstore.WithPrefix(prefix)).Acquire(ctxT(t), key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	start := time.Now()
	err := s.Complete(context.Background(), key, tok, []byte("response"), time.Minute)
	// The error, not the clock, tells the 100ms timeout from the 1s WAIT
	// (which would end in ErrNotReplicated); the bound only catches a hang.
	if d := time.Since(start); err == nil || d > 10*time.Second {
		t.Fatalf("Complete under WithTimeout(100ms) = %v after %v; want a timeout", err, d)
	}
	if !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("Complete error = %v; want a deadline error", err)
	}
	if !strings.HasPrefix(err.Error(), "redisstore: complete: ") {
		t.Fatalf("error %q not wrapped with the redisstore prefix", err)
	}
}

// TestAcquireOwnRetry: a SET that go-redis sends again after its reply was
// lost finds the value it wrote: acquired. Another token, or the same token
// with another fingerprint, is shown the record.
func TestAcquireOwnRetry(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
	key, tok := storetest.Key(), storetest.Token()
	for i := range 2 {
		if rec, ok, err := s.Acquire(ctxT(t), key, tok, "fp", time.Minute); err != nil || !ok {
			t.Fatalf("Acquire %d under the same token = %+v, %v, %v; want acquired", i, rec, ok, err)
		}
	}
	for _, other := range []struct{ token, fp string }{{storetest.Token(), "fp"}, {tok, "fp-2"}} {
		rec, ok, err := s.Acquire(ctxT(t), key, other.token, other.fp, time.Minute)
		if err != nil || ok || rec.State != idem.StateInProgress || rec.Token != tok || rec.Fingerprint != "fp" {
			t.Fatalf("Acquire(%.8s, %s) = %+v, %v, %v; want the in-progress record of %.8s, fp", other.token, other.fp, rec, ok, err, tok)
		}
	}
}

// TestConformanceRESP2 runs the suite on a RESP2 connection (nil replies
// are "$-1", not RESP3's "_").
func TestConformanceRESP2(t *testing.T) {
	t.Parallel()
	opt, err := redis.ParseURL(redisURL())
	if err != nil {
		t.Fatal(err)
	}
	opt.Protocol = 2
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(ctxT(t)).Err(); err != nil {
		unavailable(t, "Redis unreachable at %s: %v", redisURL(), err)
	}
	conformance(t, c)
}

// TestAcquireErrorReply: Acquire's SET goes unparsed; an error reply other
// than WRONGTYPE (here READONLY, from a replica) sends it again parsed, so
// that go-redis applies its redirections and retries, and is returned.
func TestAcquireErrorReply(t *testing.T) {
	t.Parallel()
	_, replica := startReplicatedPair(t)
	c := redis.NewClient(&redis.Options{Addr: replica.addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	hook := &countHook{}
	c.AddHook(hook)
	s := redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
	if err := c.Ping(ctxT(t)).Err(); err != nil { // dials the connection
		t.Fatal(err)
	}
	hook.reset()
	_, ok, err := s.Acquire(ctxT(t), storetest.Key(), storetest.Token(), "fp", time.Minute)
	if ok || err == nil || !strings.Contains(err.Error(), "READONLY") || errors.Is(err, idem.ErrCorrupt) {
		t.Fatalf("Acquire on a replica = %v, %v; want a READONLY error", ok, err)
	}
	// A connection dialed for the store's first command sends its
	// handshake (HELLO, CLIENT SETINFO), no command of the store.
	if got := storeCommands(hook.names()); len(got) != 2 || got[0] != "set" || got[1] != "set" {
		t.Fatalf("Acquire on a replica sent %v; want SET (raw), then SET (parsed)", hook.names())
	}
}

// storeCommands drops from names (of a countHook) the commands go-redis
// sends when it dials a connection: HELLO and CLIENT (alone or pipelined).
func storeCommands(names []string) []string {
	var out []string
	for _, n := range names {
		if n == "hello" || strings.HasPrefix(n, "client") || strings.HasPrefix(n, "pipeline[client") {
			continue
		}
		out = append(out, n)
	}
	return out
}

func TestJournal(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	storetest.RunJournal(t, func(t *testing.T) idem.Store {
		return redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
	})
}

func TestClusterJournal(t *testing.T) {
	t.Parallel()
	c := newClusterClient(t)
	storetest.RunJournal(t, func(t *testing.T) idem.Store {
		return redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
	})
}
