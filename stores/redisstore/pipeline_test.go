package redisstore_test

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"slices"
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

// autoPipeline returns c's auto-pipeliner (go-redis AutoPipeline()),
// closed at the end of the test.
func autoPipeline(t *testing.T, c interface {
	AutoPipeline() (*redis.AutoPipeliner, error)
}) *redis.AutoPipeliner {
	t.Helper()
	ap, err := c.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ap.Close() })
	return ap
}

// TestConformancePipelined runs the suites with the per-record commands
// going through the client's auto-pipeliner (WithPipeliner).
func TestConformancePipelined(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ap := autoPipeline(t, c)
	conformance(t, c, redisstore.WithPipeliner(ap))
	t.Run("Journal", func(t *testing.T) {
		storetest.RunJournal(t, func(t *testing.T) idem.Store {
			return redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)), redisstore.WithPipeliner(ap))
		})
	})
}

func TestClusterConformancePipelined(t *testing.T) {
	t.Parallel()
	c := newClusterClient(t)
	conformance(t, c, redisstore.WithPipeliner(autoPipeline(t, c)))
}

// resendHook runs every command and every pipeline twice, as an
// auto-pipeliner (or go-redis's own retries) does when it resends a batch
// after a dropped connection: the caller gets the second run's replies.
type resendHook struct {
	on      atomic.Bool
	resends atomic.Int64 // commands and pipelines sent twice
}

func (h *resendHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *resendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() {
			h.resends.Add(1)
			_ = next(ctx, cmd)
		}
		return next(ctx, cmd)
	}
}

func (h *resendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.on.Load() {
			h.resends.Add(1)
			_ = next(ctx, cmds)
		}
		return next(ctx, cmds)
	}
}

// TestResentBatch sends every command of the store twice (resendHook on
// an auto-pipelined client) and checks what the engine relies on after a
// resend: Acquire's second SET finds its own value and counts as acquired;
// Complete's second run finds the record completed and answers
// ErrNotOwner, while the record holds the response (the engine then reads
// it, "landed", and counts the completion); Release's second run finds no
// key (ErrNotOwner, which the engine takes as released); Extend's second
// PEXPIRE renews the same lease again; a takeover script's second run
// finds the record its own and counts as the takeover. Through the engine, concurrent
// duplicates over the resending client execute once and replay the
// stored answer.
func TestResentBatch(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	hook := new(resendHook)
	c.AddHook(hook)
	ap := autoPipeline(t, c)
	s := redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)), redisstore.WithPipeliner(ap))
	ctx := ctxT(t)
	hook.on.Store(true)

	key, tok, fp := storetest.Key(), storetest.Token(), "fp"
	if _, acquired, err := s.Acquire(ctx, key, tok, fp, time.Minute); err != nil || !acquired {
		t.Fatalf("Acquire sent twice: acquired %v, %v; want acquired", acquired, err)
	}
	if err := s.Extend(ctx, key, tok, time.Minute); err != nil {
		t.Fatalf("Extend sent twice: %v", err)
	}
	resp := []byte("the response")
	if err := s.Complete(ctx, key, tok, resp, time.Hour); err != nil && !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete sent twice: %v; want nil or ErrNotOwner", err)
	}
	rec, found, err := s.Get(ctx, key)
	if err != nil || !found || rec.State != idem.StateCompleted || string(rec.Response) != string(resp) || rec.Fingerprint != fp {
		t.Fatalf("after Complete sent twice: %+v found %v, %v; want completed with the response", rec, found, err)
	}

	key, tok = storetest.Key(), storetest.Token()
	if _, acquired, err := s.Acquire(ctx, key, tok, fp, time.Minute); err != nil || !acquired {
		t.Fatalf("Acquire sent twice: acquired %v, %v", acquired, err)
	}
	if err := s.Release(ctx, key, tok); err != nil && !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Release sent twice: %v; want nil or ErrNotOwner", err)
	}
	if _, found, err := s.Get(ctx, key); err != nil || found {
		t.Fatalf("after Release sent twice: found %v, %v; want no record", found, err)
	}
	if hook.resends.Load() < 6 {
		t.Fatalf("%d commands or pipelines sent twice; the hook missed the auto-pipeliner's batches", hook.resends.Load())
	}

	// A takeover of a record with a step journal whose lease lapsed: its
	// script's second run finds the record under its own token.
	key, tok = storetest.Key(), storetest.Token()
	hook.on.Store(false)
	const lease = 200 * time.Millisecond
	if _, acquired, err := s.Acquire(ctx, key, tok, fp, lease); err != nil || !acquired {
		t.Fatalf("Acquire: acquired %v, %v", acquired, err)
	}
	if _, err := s.StartStep(ctx, key, tok, "charge", time.Minute); err != nil {
		t.Fatalf("StartStep: %v", err)
	}
	hook.on.Store(true)
	tok2 := storetest.Token()
	for start := time.Now(); ; time.Sleep(lease / 4) {
		rec, acquired, err := s.Acquire(ctx, key, tok2, fp, time.Minute)
		if err != nil {
			t.Fatalf("takeover sent twice: %v", err)
		}
		if acquired {
			if rec.LeaseLeft >= 0 || rec.Token != "" && rec.Token != tok {
				t.Errorf("takeover sent twice: %+v; want LeaseLeft < 0 and the previous token %q or none (unknown)", rec, tok)
			}
			break
		}
		if rec.Token == tok2 {
			t.Fatalf("takeover sent twice answered its own record in progress: %+v", rec)
		}
		if time.Since(start) > 10*time.Second { // the lease is 200ms: long lapsed
			t.Fatalf("no takeover 10s after a %v lease: %+v", lease, rec)
		}
	}

	e, err := idem.New(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	var executions atomic.Int32
	srv := newInstance(t, e, &executions, 50*time.Millisecond)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	const keys, copies = 5, 8
	var wg sync.WaitGroup
	var created atomic.Int32
	for k := range keys {
		for range copies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					a, err := post(client, srv.URL, "resent-"+tok+"-"+string(rune('a'+k)), `{"amount":1}`)
					if err != nil {
						t.Errorf("key %d: %v", k, err)
						return
					}
					if a.status == http.StatusConflict { // in progress: retry, as a client does
						time.Sleep(20 * time.Millisecond)
						continue
					}
					if a.status != http.StatusCreated {
						t.Errorf("key %d: answered %d %q; want 201", k, a.status, a.problem)
					}
					created.Add(1)
					return
				}
			}()
		}
	}
	wg.Wait()
	if got := executions.Load(); got != keys {
		t.Errorf("%d executions for %d keys sent %d times each over a client that sends every command twice; want %d", got, keys, copies, keys)
	}
	if got := created.Load(); got != keys*copies {
		t.Errorf("%d answers 201; want %d", got, keys*copies)
	}
}

// gateHook holds the first command or pipeline it sees on a key under
// prefix (a stalled server, as far as the store can tell) until release
// is closed, and records the size of every batch it sees on such keys
// (1 for a command sent alone).
type gateHook struct {
	prefix  string
	off     atomic.Bool // set: record and hold nothing
	release chan struct{}
	held    chan struct{} // closed when the first batch is held
	once    sync.Once
	mu      sync.Mutex
	batches []int
}

func newGateHook(prefix string) *gateHook {
	return &gateHook{prefix: prefix, release: make(chan struct{}), held: make(chan struct{})}
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.gate([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.gate(cmds)
		return next(ctx, cmds)
	}
}

// gate records cmds when one of them is on a key under h.prefix, and
// holds the first such batch until h.release is closed (whatever its
// context says: a queued command does not end with its context).
func (h *gateHook) gate(cmds []redis.Cmder) {
	n := 0
	for _, c := range cmds {
		for _, a := range c.Args() {
			if s, ok := a.(*string); ok { // Acquire's SET boxes its key once
				a = *s
			}
			if s, ok := a.(string); ok && strings.HasPrefix(s, h.prefix) {
				n++
				break
			}
		}
	}
	if n == 0 || h.off.Load() {
		return
	}
	h.mu.Lock()
	h.batches = append(h.batches, n)
	h.mu.Unlock()
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.held)
		<-h.release
	}
}

func (h *gateHook) sizes() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.batches)
}

// waitFor waits for cond, failing the test after 2 minutes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 2 minutes: %s", what)
		}
	}
}

// TestDefaultPipelines: a store given the client's asynchronous
// auto-pipeliner (WithPipeliner) queues the commands of concurrent calls on the client's
// auto-pipeliner, which sends them in batches: with the first command held
// (a slow server), the next ones wait in its queue, and go in fewer round
// trips than commands once it is released.
func TestDefaultPipelines(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	prefix := newPrefix(t, c)
	hook := newGateHook(prefix)
	c.AddHook(hook)
	t.Cleanup(func() { closeOnce(hook.release) }) // before the client closes
	s := redisstore.New(c, redisstore.WithPrefix(prefix), redisstore.WithPipeliner(asyncAP(t, c)))
	ctx := ctxT(t)

	const calls = 32
	errs := make(chan error, calls)
	acquire := func() {
		_, ok, err := s.Acquire(ctx, storetest.Key(), storetest.Token(), "fp", time.Minute)
		if err == nil && !ok {
			err = errors.New("a new key was not acquired")
		}
		errs <- err
	}
	go acquire()
	select {
	case <-hook.held:
	case <-time.After(2 * time.Minute):
		t.Fatal("the first Acquire sent nothing within 2 minutes")
	}
	for range calls - 1 {
		go acquire()
	}
	// A goroutine waiting in AutoFuture.Wait has queued its command
	// on an auto-pipeliner.
	waitFor(t, "the Acquires did not all queue their SET on an auto-pipeliner", func() bool {
		return waiting() >= calls
	})
	close(hook.release)
	for range calls {
		if err := <-errs; err != nil {
			t.Fatalf("Acquire: %v", err)
		}
	}
	sizes := hook.sizes()
	sent := 0
	for _, n := range sizes {
		sent += n
	}
	if sent != calls || len(sizes) > calls/2 {
		t.Fatalf("%d SETs in %d round trips %v; want %d in at most %d", sent, len(sizes), sizes, calls, calls/2)
	}
	t.Logf("%d SETs in %d round trips %v", sent, len(sizes), sizes)
}

// TestDefaultTimeout: with the store's commands held in the auto-pipeliner
// (the first one held by the server, as far as the client can tell), the
// store's timeout still ends a call, the one held (a completion) and the
// one queued behind it (a read): the store stops waiting for a command
// whose context ended, whatever the client's timeouts. Once the server
// answers, the store works again.
func TestDefaultTimeout(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	prefix := newPrefix(t, c)
	hook := newGateHook(prefix)
	hook.off.Store(true)
	c.AddHook(hook)
	t.Cleanup(func() { closeOnce(hook.release) })
	s := redisstore.New(c, redisstore.WithPrefix(prefix), redisstore.WithTimeout(100*time.Millisecond), redisstore.WithPipeliner(asyncAP(t, c)))
	key, tok := storetest.Key(), storetest.Token()
	waitFor(t, "Acquire did not succeed", func() bool {
		_, ok, err := s.Acquire(context.Background(), key, tok, "fp", time.Minute)
		return err == nil && ok
	})
	hook.off.Store(false)

	errs := make(chan error, 2)
	go func() { errs <- s.Complete(context.Background(), key, tok, []byte("response"), time.Minute) }()
	select {
	case <-hook.held:
	case <-time.After(2 * time.Minute):
		t.Fatal("Complete sent nothing within 2 minutes")
	}
	go func() {
		_, _, err := s.Get(context.Background(), key)
		errs <- err
	}()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a call held past the store's timeout = %v; want an error wrapping context.DeadlineExceeded", err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("a call held by the server did not end with the store's timeout within 2 minutes")
		}
	}
	hook.off.Store(true)
	close(hook.release)
	waitFor(t, "the store did not read the record once the server answered", func() bool {
		rec, found, err := s.Get(context.Background(), key)
		return err == nil && found && rec.State == idem.StateCompleted
	})
}

// TestAbandonedArgumentsCopied: a FinishStep whose reply the store stops
// waiting for (the store's timeout, the command held by the server) goes
// out later with the result as it was given, even though the caller wrote
// over its buffer after the call returned.
func TestAbandonedArgumentsCopied(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	prefix := newPrefix(t, c)
	hook := newGateHook(prefix)
	hook.off.Store(true)
	c.AddHook(hook)
	t.Cleanup(func() { closeOnce(hook.release) })
	s := redisstore.New(c, redisstore.WithPrefix(prefix), redisstore.WithPipeliner(asyncAP(t, c)))
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctxT(t), key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire: %v, %v", ok, err)
	}
	if _, err := s.StartStep(ctxT(t), key, tok, "charge", time.Minute); err != nil {
		t.Fatalf("StartStep: %v", err)
	}
	hook.off.Store(false)
	result := []byte("charged ch_1")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.FinishStep(ctx, key, tok, "charge", result) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("FinishStep held by the server = %v; want an error wrapping context.DeadlineExceeded", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("FinishStep held by the server did not end with its context within 2 minutes")
	}
	copy(result, "XXXXXXXXXXXX") // the caller reuses its buffer
	hook.off.Store(true)
	close(hook.release)
	waitFor(t, "the held FinishStep did not land", func() bool {
		steps, err := s.Steps(ctxT(t), key)
		if err != nil || len(steps) != 1 || !steps[0].Done {
			return false
		}
		if got := string(steps[0].Result); got != "charged ch_1" {
			t.Fatalf("the step's result is %q; want %q, as given to FinishStep", got, "charged ch_1")
		}
		return true
	})
}

// asyncAP returns c's asynchronous auto-pipeliner taken with
// redisstore.AutoPipelineOptions (closed with c).
func asyncAP(t *testing.T, c *redis.Client) *redis.AutoPipeliner {
	t.Helper()
	ap, err := c.AsyncAutoPipelineWithOptions(redisstore.AutoPipelineOptions())
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// closeOnce closes ch unless it is closed.
func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// waiting counts the goroutines waiting for a command queued on an
// auto-pipeliner (in AutoFuture.Wait or WaitContext).
func waiting() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "go-redis/v9.AutoFuture.Wait") // Wait or WaitContext
		}
		buf = make([]byte, 2*len(buf))
	}
}
