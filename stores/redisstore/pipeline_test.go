package redisstore_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
)

// TestConformanceUnbatched runs the suites with every command on one
// record sent alone (WithoutBatching).
func TestConformanceUnbatched(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	conformance(t, c, redisstore.WithoutBatching())
	t.Run("Journal", func(t *testing.T) {
		storetest.RunJournal(t, func(t *testing.T) idem.Store {
			return redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)), redisstore.WithoutBatching())
		})
	})
}

// resendHook runs every command and every pipeline twice, as go-redis's
// own retries do when it resends a batch
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
// the client) and checks what the engine relies on after a
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
	s := redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
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
		t.Fatalf("%d commands or pipelines sent twice; the hook missed the store's commands", hook.resends.Load())
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
