package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
)

// Records written by v0.1 (one hash per record, fields s, t, f, r) stay in
// Redis for their retention after an upgrade. These tests write them with
// HSET, exactly as v0.1's scripts did, and check the new store answers
// from them, never writes a hash, and takes the key over once it expired.

// writeV01 writes a v0.1 record: HSET s state [t token] f fp [r response],
// then PEXPIRE ttl, as v0.1's acquire and complete scripts did.
func writeV01(t *testing.T, c redis.UniversalClient, k, state, token, fp string, resp *idem.Response, ttl time.Duration) {
	t.Helper()
	fields := []any{"s", state, "f", fp}
	if token != "" {
		fields = append(fields, "t", token)
	}
	if resp != nil {
		enc, err := resp.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		fields = append(fields, "r", enc)
	}
	if err := c.HSet(ctxT(t), k, fields...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.PExpire(ctxT(t), k, ttl).Err(); err != nil {
		t.Fatal(err)
	}
}

// writeHook fails the test on any command that writes a hash.
type writeHook struct{ t *testing.T }

func (h writeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h writeHook) check(cmd redis.Cmder) {
	switch cmd.Name() {
	case "hset", "hmset", "hsetnx", "hdel", "hincrby":
		h.t.Errorf("the store sent %v: it must never write a hash", cmd.Args())
	}
}

func (h writeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.check(cmd); return next(ctx, cmd) }
}

func (h writeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.check(c)
		}
		return next(ctx, cmds)
	}
}

// migrationRig is an engine on a store whose own client may not write a
// hash, and a second client (direct) that writes the v0.1 records.
type migrationRig struct {
	direct *redis.Client
	prefix string
	store  *redisstore.Store
	engine *idem.Engine
}

func newMigrationRig(t *testing.T, opts ...redisstore.Option) *migrationRig {
	direct := newClient(t)
	prefix := newPrefix(t, direct)
	c := newClient(t)
	c.AddHook(writeHook{t})
	store := redisstore.New(c, append([]redisstore.Option{redisstore.WithPrefix(prefix)}, opts...)...)
	e, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	return &migrationRig{direct: direct, prefix: prefix, store: store, engine: e}
}

const v01Body = `{"amount":100}`

// v01Key returns the scoped key and fingerprint the engine computes for
// request(key, v01Body).
func v01Key(key string) (scoped, fp string) {
	return idem.ScopedKey("alice", "POST", "/v1/payments", key),
		idem.Fingerprint("POST", "/v1/payments", "", "application/json", []byte(v01Body))
}

// ownerless checks Complete, Release and Extend of every token answer
// ErrNotOwner on the v0.1 record at key and leave it as it was.
func (r *migrationRig) ownerless(t *testing.T, key string, tokens ...string) {
	t.Helper()
	k := r.prefix + key
	before, _ := r.direct.Dump(ctxT(t), k).Result()
	for _, tok := range tokens {
		if err := r.store.Complete(ctxT(t), key, tok, &idem.Response{Status: 200}, time.Hour); !errors.Is(err, idem.ErrNotOwner) {
			t.Errorf("Complete(%q) on a v0.1 record = %v; want ErrNotOwner", tok, err)
		}
		if err := r.store.Extend(ctxT(t), key, tok, time.Hour); !errors.Is(err, idem.ErrNotOwner) {
			t.Errorf("Extend(%q) on a v0.1 record = %v; want ErrNotOwner", tok, err)
		}
		if err := r.store.Release(ctxT(t), key, tok); !errors.Is(err, idem.ErrNotOwner) {
			t.Errorf("Release(%q) on a v0.1 record = %v; want ErrNotOwner", tok, err)
		}
	}
	if after, _ := r.direct.Dump(ctxT(t), k).Result(); after != before {
		t.Errorf("the v0.1 record changed under Complete, Extend and Release")
	}
}

// TestV01Completed: a completed v0.1 record is replayed (and 422 for another
// body), read by Get and Inspect, evicted by Evict, and owned by no token.
func TestV01Completed(t *testing.T) {
	t.Parallel()
	r := newMigrationRig(t)
	scoped, fp := v01Key("v01-done")
	stored := &idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_v01"}`)}
	writeV01(t, r.direct, r.prefix+scoped, "2", "", fp, stored, time.Hour)

	x, resp := r.engine.Begin(ctxT(t), request("v01-done", v01Body))
	if x != nil || resp == nil || resp.Status != 201 || !resp.IsReplay() || string(resp.Body) != `{"id":"pay_v01"}` {
		t.Fatalf("retry of a v0.1 completed record = %v, %+v; want the 201 replay", x != nil, resp)
	}
	if _, resp := r.engine.Begin(ctxT(t), request("v01-done", `{"amount":999}`)); resp == nil || resp.Status != 422 {
		t.Fatalf("other body on a v0.1 completed record = %+v; want 422", resp)
	}
	rec, ok, err := r.store.Acquire(ctxT(t), scoped, storetest.Token(), fp, time.Minute)
	if err != nil || ok || rec.State != idem.StateCompleted || rec.Fingerprint != fp || rec.Response == nil || !bytes.Equal(rec.Response.Body, stored.Body) {
		t.Fatalf("Acquire = %+v, %v, %v; want the completed v0.1 record", rec, ok, err)
	}
	if rec, found, err := r.store.Get(ctxT(t), scoped); err != nil || !found || rec.State != idem.StateCompleted || rec.Response.Status != 201 {
		t.Fatalf("Get = %+v, %v, %v; want the completed v0.1 record", rec, found, err)
	}
	info, found, err := r.store.Inspect(ctxT(t), scoped)
	if err != nil || !found || info.State != idem.StateCompleted || info.Fingerprint != fp || info.TTL <= 0 || info.TTL > time.Hour {
		t.Fatalf("Inspect = %+v, %v, %v; want the completed v0.1 record and its TTL", info, found, err)
	}
	r.ownerless(t, scoped, storetest.Token(), "")
	// The WithWaitReplicas pipeline (script and WAIT) answers the same.
	waiting := redisstore.New(r.direct, redisstore.WithPrefix(r.prefix), redisstore.WithWaitReplicas(1, time.Millisecond))
	if err := waiting.Complete(ctxT(t), scoped, storetest.Token(), &idem.Response{Status: 200}, time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete under WithWaitReplicas on a v0.1 record = %v; want ErrNotOwner", err)
	}
	if typ := r.direct.Type(ctxT(t), r.prefix+scoped).Val(); typ != "hash" {
		t.Fatalf("the v0.1 record is a %s now; want it left a hash", typ)
	}
	if err := r.store.Evict(ctxT(t), scoped, idem.Record{State: idem.StateCompleted, Fingerprint: "other"}); !errors.Is(err, idem.ErrRecordChanged) {
		t.Fatalf("Evict with another fingerprint = %v; want ErrRecordChanged", err)
	}
	if err := r.store.Evict(ctxT(t), scoped, info.Record); err != nil {
		t.Fatalf("Evict of the inspected v0.1 record: %v", err)
	}
	// Evicted: the retry executes, and writes the new layout.
	x, resp = r.engine.Begin(ctxT(t), request("v01-done", v01Body))
	if x == nil {
		t.Fatalf("retry after Evict = %+v; want an execution", resp)
	}
	x.Write([]byte("again"))
	x.Finish(201, nil)
	if typ := r.direct.Type(ctxT(t), r.prefix+scoped).Val(); typ != "string" {
		t.Fatalf("the record written after the upgrade is a %s; want a string", typ)
	}
}

// TestV01InProgress: an in-progress v0.1 record answers 409 until it
// expires; its token owns nothing on the new store; once it expired the
// next retry executes and writes the new layout.
func TestV01InProgress(t *testing.T) {
	t.Parallel()
	r := newMigrationRig(t)
	scoped, fp := v01Key("v01-running")
	oldToken := storetest.Token()
	k := r.prefix + scoped
	writeV01(t, r.direct, k, "1", oldToken, fp, nil, time.Minute)

	if _, resp := r.engine.Begin(ctxT(t), request("v01-running", v01Body)); resp == nil || resp.Status != 409 {
		t.Fatalf("retry while the v0.1 lease lives = %+v; want 409", resp)
	}
	if _, resp := r.engine.Begin(ctxT(t), request("v01-running", `{"amount":999}`)); resp == nil || resp.Status != 422 {
		t.Fatalf("other body on a v0.1 in-progress record = %+v; want 422", resp)
	}
	// Not even the v0.1 owner's token is acquired (v0.1's own acquire
	// script would have said yes: this store never owns a hash).
	for _, tok := range []string{oldToken, storetest.Token()} {
		rec, ok, err := r.store.Acquire(ctxT(t), scoped, tok, fp, time.Minute)
		if err != nil || ok || rec.State != idem.StateInProgress || rec.Token != oldToken || rec.Fingerprint != fp {
			t.Fatalf("Acquire(%q) = %+v, %v, %v; want the in-progress v0.1 record", tok, rec, ok, err)
		}
	}
	info, found, err := r.store.Inspect(ctxT(t), scoped)
	if err != nil || !found || info.State != idem.StateInProgress || info.Token != oldToken || info.TTL <= 0 || info.TTL > time.Minute {
		t.Fatalf("Inspect = %+v, %v, %v; want the in-progress v0.1 record and its lease", info, found, err)
	}
	r.ownerless(t, scoped, oldToken, storetest.Token())
	if err := r.store.Evict(ctxT(t), scoped, idem.Record{State: idem.StateInProgress, Token: "other", Fingerprint: fp}); !errors.Is(err, idem.ErrRecordChanged) {
		t.Fatalf("Evict with another token = %v; want ErrRecordChanged", err)
	}

	// The v0.1 lease lapses (by hand: no check depends on the clock).
	if err := r.direct.PExpire(ctxT(t), k, time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); r.direct.Exists(ctxT(t), k).Val() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the lapsed v0.1 lease is still there after 10s")
		}
	}
	x, resp := r.engine.Begin(ctxT(t), request("v01-running", v01Body))
	if x == nil {
		t.Fatalf("retry after the v0.1 lease lapsed = %+v; want an execution", resp)
	}
	x.Write([]byte(`{"id":"pay_new"}`))
	x.Finish(201, nil)
	if typ := r.direct.Type(ctxT(t), k).Val(); typ != "string" {
		t.Fatalf("the record written after the upgrade is a %s; want a string", typ)
	}
	if _, resp := r.engine.Begin(ctxT(t), request("v01-running", v01Body)); resp == nil || resp.Status != 201 || string(resp.Body) != `{"id":"pay_new"}` {
		t.Fatalf("retry after the new execution = %+v; want its replay", resp)
	}
}

// vanishHook deletes the key of the first EVALSHA it sees (the v0.1
// record Acquire is about to read after SET answered WRONGTYPE), as if the
// record expired between the two commands.
type vanishHook struct {
	t      *testing.T
	direct *redis.Client
	done   bool
}

func (h *vanishHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *vanishHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); (name == "evalsha" || name == "eval") && !h.done {
			h.done = true
			k, _ := cmd.Args()[3].(string)
			if n, err := h.direct.Del(ctx, k).Result(); n != 1 || err != nil {
				h.t.Errorf("DEL %q = %d, %v; want the v0.1 record deleted", k, n, err)
			}
		}
		return next(ctx, cmd)
	}
}

func (h *vanishHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestV01ExpiresDuringAcquire: the v0.1 record that made SET answer
// WRONGTYPE expires before Acquire reads it: Acquire sends SET again and
// acquires.
func TestV01ExpiresDuringAcquire(t *testing.T) {
	t.Parallel()
	direct := newClient(t)
	prefix := newPrefix(t, direct)
	c := newClient(t)
	hook := &countHook{}
	c.AddHook(&vanishHook{t: t, direct: direct})
	c.AddHook(hook)
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	key, tok := storetest.Key(), storetest.Token()
	writeV01(t, direct, prefix+key, "2", "", "fp", &idem.Response{Status: 201}, time.Hour)
	rec, ok, err := s.Acquire(ctxT(t), key, tok, "fp", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire = %+v, %v, %v; want acquired once the v0.1 record is gone", rec, ok, err)
	}
	if got := hook.names(); len(got) != 3 || got[0] != "set" || got[1] != "evalsha" || got[2] != "set" {
		t.Fatalf("Acquire sent %v; want SET (WRONGTYPE), the read (nothing there), SET", got)
	}
	if v := direct.Get(ctxT(t), prefix+key).Val(); !strings.HasPrefix(v, "1") || !strings.Contains(v, tok) {
		t.Fatalf("value after Acquire = %q; want in-progress under %s", v, tok)
	}
}

// TestV01Cluster: the v0.1 record is read on a Cluster too (the read
// follows the key to its slot's master).
func TestV01Cluster(t *testing.T) {
	t.Parallel()
	c := newClusterClient(t)
	prefix := newPrefix(t, c)
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	for range 4 { // several slots
		key := storetest.Key()
		writeV01(t, c, prefix+key, "2", "", "fp", &idem.Response{Status: 201, Body: []byte("old")}, time.Hour)
		rec, ok, err := s.Acquire(ctxT(t), key, storetest.Token(), "fp", time.Minute)
		if err != nil || ok || rec.State != idem.StateCompleted || string(rec.Response.Body) != "old" {
			t.Fatalf("Acquire = %+v, %v, %v; want the completed v0.1 record", rec, ok, err)
		}
		if err := s.Complete(ctxT(t), key, storetest.Token(), &idem.Response{Status: 200}, time.Hour); !errors.Is(err, idem.ErrNotOwner) {
			t.Fatalf("Complete = %v; want ErrNotOwner", err)
		}
	}
}
