package redisstore_test

import (
	"context"
	"errors"
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

// gateHook records every command and pipeline that carries a key under
// prefix, and holds the next h.hold of them (a stalled server, as far as
// the store can tell: before the write, whatever their context says)
// until the test releases each one.
type gateHook struct {
	prefix string
	hold   atomic.Int32       // batches still to hold
	held   chan chan struct{} // the release channel of each batch held
	mu     sync.Mutex
	sizes  []int    // commands on keys under prefix, per batch
	args   []string // every argument under prefix seen
	gates  []chan struct{}
}

func newGateHook(t *testing.T, prefix string) *gateHook {
	h := &gateHook{prefix: prefix, held: make(chan chan struct{}, 16)}
	t.Cleanup(h.releaseAll) // before the client closes
	return h
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

func (h *gateHook) gate(cmds []redis.Cmder) {
	n := 0
	var seen []string
	for _, c := range cmds {
		mine := false
		for _, a := range c.Args() {
			if s, ok := a.(*string); ok { // Acquire's SET boxes its key once
				a = *s
			}
			if s, ok := a.(string); ok && strings.HasPrefix(s, h.prefix) {
				seen = append(seen, s)
				mine = true
			}
		}
		if mine {
			n++
		}
	}
	if n == 0 {
		return
	}
	h.mu.Lock()
	h.sizes = append(h.sizes, n)
	h.args = append(h.args, seen...)
	var gate chan struct{}
	if h.hold.Load() > 0 {
		h.hold.Add(-1)
		gate = make(chan struct{})
		h.gates = append(h.gates, gate)
	}
	h.mu.Unlock()
	if gate != nil {
		h.held <- gate
		<-gate
	}
}

// next returns the release channel of the next batch held, failing the
// test after 2 minutes.
func (h *gateHook) next(t *testing.T) chan struct{} {
	t.Helper()
	select {
	case g := <-h.held:
		return g
	case <-time.After(2 * time.Minute):
		t.Fatal("no batch held within 2 minutes")
		return nil
	}
}

func (h *gateHook) releaseAll() {
	h.hold.Store(0)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, g := range h.gates {
		closeOnce(g)
	}
}

func (h *gateHook) batches() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.sizes)
}

func (h *gateHook) sawArg(s string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.args, s)
}

// closeOnce closes ch unless it is closed.
func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
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

// holdSlots starts redisstore.MaxFlushes(s) Acquires on s and returns once
// the hook holds each one's SET: every flush slot of s is taken. Their
// errors go to errs.
func holdSlots(t *testing.T, s *redisstore.Store, h *gateHook, errs chan<- error) []chan struct{} {
	t.Helper()
	h.hold.Store(int32(redisstore.MaxFlushes(s)))
	var gates []chan struct{}
	for range redisstore.MaxFlushes(s) {
		go func() {
			_, ok, err := s.Acquire(context.Background(), storetest.Key(), storetest.Token(), "fp", time.Minute)
			if err == nil && !ok {
				err = errors.New("a new key was not acquired")
			}
			errs <- err
		}()
		gates = append(gates, h.next(t))
	}
	return gates
}

// TestBatchesShare: with every flush slot held (a slow server), the
// commands of concurrent calls queue, and once the slots are released go
// in at most two pipelines, each call with its own reply.
func TestBatchesShare(t *testing.T) {
	t.Parallel()
	for _, cluster := range []bool{false, true} {
		name := "standalone"
		var c redis.UniversalClient
		if cluster {
			name = "cluster"
		}
		t.Run(name, func(t *testing.T) {
			if cluster {
				c = newClusterClient(t)
			} else {
				c = newClient(t)
			}
			prefix := newPrefix(t, c)
			hook := newGateHook(t, prefix)
			c.AddHook(hook)
			s := redisstore.New(c, redisstore.WithPrefix(prefix))
			const calls = 32
			errs := make(chan error, calls+redisstore.MaxFlushes(s))
			gates := holdSlots(t, s, hook, errs)
			keys := make([]string, calls)
			for i := range keys {
				keys[i] = storetest.Key()
				go func() {
					_, ok, err := s.Acquire(context.Background(), keys[i], "tok", "fp", time.Minute)
					if err == nil && !ok {
						err = errors.New("a new key was not acquired")
					}
					errs <- err
				}()
			}
			waitFor(t, "the Acquires did not all queue", func() bool { return redisstore.Queued(s) == calls })
			// One held flight ends first: the queued caller it hands its
			// slot to takes the whole queue before the others end (each
			// ending flight hands a slot to one queued caller).
			close(gates[0])
			waitFor(t, "the queue was not taken", func() bool { return redisstore.Queued(s) == 0 })
			for _, g := range gates[1:] {
				close(g)
			}
			for range calls + redisstore.MaxFlushes(s) {
				if err := <-errs; err != nil {
					t.Fatalf("Acquire: %v", err)
				}
			}
			sizes := hook.batches()[redisstore.MaxFlushes(s):]
			sent := 0
			for _, n := range sizes {
				sent += n
			}
			if sent != calls || len(sizes) > 2 {
				t.Fatalf("batches after the held ones %v: want the %d queued SETs in at most 2 pipelines", sizes, calls)
			}
			t.Logf("batches after the held ones: %v", sizes)
			for _, k := range keys { // each call read its own reply: its key is its own
				if rec, found, err := s.Get(ctxT(t), k); err != nil || !found || rec.State != idem.StateInProgress || rec.Token != "tok" {
					t.Fatalf("Get(%s) = %+v, %v, %v; want in progress", k, rec, found, err)
				}
			}
		})
	}
}

// newGatedStore returns a client to the standalone Redis with a gateHook
// on a fresh prefix, and a store on it with its defaults.
func newGatedStore(t *testing.T) (*redis.Client, string, *gateHook, *redisstore.Store) {
	t.Helper()
	c := newClient(t)
	prefix := newPrefix(t, c)
	hook := newGateHook(t, prefix)
	c.AddHook(hook)
	return c, prefix, hook, redisstore.New(c, redisstore.WithPrefix(prefix))
}

// TestQueuedEndedNeverSent: a command queued behind held flushes whose
// context ends (cancelled, or the store's timeout) returns the context's
// error and is never sent, not even once the flushes it waited behind
// end: Acquire's SET leaves no record, Complete leaves the record in
// progress.
func TestQueuedEndedNeverSent(t *testing.T) {
	t.Parallel()
	c, prefix, hook, s := newGatedStore(t)
	done, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctxT(t), done, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire: %v, %v", ok, err)
	}

	errs := make(chan error, redisstore.MaxFlushes(s))
	gates := holdSlots(t, s, hook, errs)

	fresh := storetest.Key()
	ctx, cancel := context.WithCancel(context.Background())
	acquired := make(chan error, 1)
	go func() {
		_, _, err := s.Acquire(ctx, fresh, storetest.Token(), "fp", time.Minute)
		acquired <- err
	}()
	waitFor(t, "the Acquire did not queue", func() bool { return redisstore.Queued(s) == 1 })
	cancel()
	if err := <-acquired; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued Acquire cancelled = %v; want an error wrapping context.Canceled", err)
	}
	// A deadline (the engine's store timeout) ends a queued Complete: it
	// passes while the slots are held, as nothing releases them before the
	// call returns.
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	if err := s.Complete(short, done, tok, []byte("response"), time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued Complete past the store's timeout = %v; want an error wrapping context.DeadlineExceeded", err)
	}
	for _, g := range gates {
		close(g)
	}
	for range redisstore.MaxFlushes(s) {
		if err := <-errs; err != nil {
			t.Fatalf("held Acquire: %v", err)
		}
	}
	// Released: the queue is empty, nothing of the two calls went out.
	if hook.sawArg(prefix + fresh) {
		t.Error("the cancelled Acquire's SET was sent")
	}
	if n, err := c.Exists(ctxT(t), prefix+fresh).Result(); err != nil || n != 0 {
		t.Errorf("EXISTS the cancelled Acquire's key = %d, %v; want 0", n, err)
	}
	if rec, found, err := s.Get(ctxT(t), done); err != nil || !found || rec.State != idem.StateInProgress {
		t.Errorf("after a Complete dropped while queued: %+v, %v, %v; want the record in progress", rec, found, err)
	}
}

// TestTakenArgumentsCopied: a FinishStep taken into a pipeline whose
// caller stops waiting before the pipeline is written (held by the hook)
// returns its context's error, and the pipeline, written later, carries
// the result as it was given, though the caller wrote over its buffer
// after the call returned.
func TestTakenArgumentsCopied(t *testing.T) {
	t.Parallel()
	_, _, hook, s := newGatedStore(t)
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctxT(t), key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire: %v, %v", ok, err)
	}
	if _, err := s.StartStep(ctxT(t), key, tok, "charge", time.Minute); err != nil {
		t.Fatalf("StartStep: %v", err)
	}
	errs := make(chan error, redisstore.MaxFlushes(s))
	gates := holdSlots(t, s, hook, errs)

	// First in the queue, with no deadline: the leader of the next flush.
	got := make(chan error, 1)
	go func() {
		_, _, err := s.Get(context.Background(), key)
		got <- err
	}()
	waitFor(t, "the Get did not queue", func() bool { return redisstore.Queued(s) == 1 })
	result := []byte("charged ch_1")
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan error, 1)
	go func() { finished <- s.FinishStep(ctx, key, tok, "charge", result) }()
	waitFor(t, "the FinishStep did not queue", func() bool { return redisstore.Queued(s) == 2 })

	hook.hold.Store(1) // the pipeline of the Get and the FinishStep
	close(gates[0])
	pipeline := hook.next(t)
	cancel()
	if err := <-finished; !errors.Is(err, context.Canceled) {
		t.Fatalf("FinishStep taken, then cancelled = %v; want an error wrapping context.Canceled", err)
	}
	copy(result, "XXXXXXXXXXXX") // the caller reuses its buffer
	close(pipeline)
	for _, g := range gates[1:] {
		close(g)
	}
	if err := <-got; err != nil {
		t.Fatalf("Get: %v", err)
	}
	for range redisstore.MaxFlushes(s) {
		if err := <-errs; err != nil {
			t.Fatalf("held Acquire: %v", err)
		}
	}
	steps, err := s.Steps(ctxT(t), key)
	if err != nil || len(steps) != 1 || !steps[0].Done {
		t.Fatalf("Steps = %+v, %v; want the step done", steps, err)
	}
	if got := string(steps[0].Result); got != "charged ch_1" {
		t.Fatalf("the step's result is %q; want %q, as given to FinishStep", got, "charged ch_1")
	}
}

// TestBatchCancelStorm: concurrent calls, a third of them cancelled at
// any moment (queued, leading, taken or replied), each return either
// their answer or their context's error, and leave no flush slot taken:
// the queue ends empty and a later call goes through. A call that
// answered acquired finds its record in progress under its token.
func TestBatchCancelStorm(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
	const workers, calls = 32, 20
	var wg sync.WaitGroup
	var acquired sync.Map // key → token
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				ctx, cancel := context.WithCancel(context.Background())
				if (w+i)%3 == 0 {
					go cancel()
				}
				key, tok := storetest.Key(), storetest.Token()
				_, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute)
				cancel()
				switch {
				case err == nil && ok:
					acquired.Store(key, tok)
				case err == nil:
					t.Errorf("Acquire of a new key: not acquired")
				case !errors.Is(err, context.Canceled):
					t.Errorf("Acquire = %v; want its answer or context.Canceled", err)
				}
			}
		})
	}
	wg.Wait()
	if n := redisstore.Queued(s); n != 0 {
		t.Fatalf("%d commands left queued", n)
	}
	for range redisstore.MaxFlushes(s) + 1 { // every slot free: none waits
		if _, ok, err := s.Acquire(ctxT(t), storetest.Key(), storetest.Token(), "fp", time.Minute); err != nil || !ok {
			t.Fatalf("Acquire after the storm: %v, %v", ok, err)
		}
	}
	n := 0
	acquired.Range(func(k, v any) bool {
		n++
		rec, found, err := s.Get(ctxT(t), k.(string))
		if err != nil || !found || rec.State != idem.StateInProgress || rec.Token != v.(string) {
			t.Errorf("Get(%s) = %+v, %v, %v; want in progress under its token", k, rec, found, err)
		}
		return true
	})
	t.Logf("%d of %d Acquires answered", n, workers*calls)
}
