package redisstore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/redisstore"
)

// redirectHook counts the redirections and retry-later errors Redis Cluster
// nodes answered, seen on each node's own client (ClusterOptions.NewClient),
// before the cluster client follows them.
type redirectHook struct{ moved, ask, tryAgain atomic.Int64 }

func (h *redirectHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *redirectHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(err)
		return err
	}
}

func (h *redirectHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.count(c.Err())
		}
		return err
	}
}

func (h *redirectHook) count(err error) {
	if err == nil {
		return
	}
	switch s := err.Error(); {
	case strings.HasPrefix(s, "MOVED "):
		h.moved.Add(1)
	case strings.HasPrefix(s, "ASK "):
		h.ask.Add(1)
	case strings.HasPrefix(s, "TRYAGAIN"):
		h.tryAgain.Add(1)
	}
}

// privateCluster starts a 3-master cluster of the test's own (the shared
// one's slot map must stand still for the other tests), stopped at cleanup.
func privateCluster(t *testing.T) []string {
	t.Helper()
	server, cli := binary(t, "redis-server"), binary(t, "redis-cli")
	addrs, procs, err := createCluster(server, cli, t.TempDir())
	t.Cleanup(func() {
		for _, p := range procs {
			p.stop()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return addrs
}

// errCountingStore counts the store calls that failed (other than with
// ErrNotOwner, ErrNotReplicated: answers, not failures).
type errCountingStore struct {
	*redisstore.Store
	errors atomic.Int64
	first  atomic.Value
}

func (s *errCountingStore) failed(err error) error {
	if err != nil && !errors.Is(err, idem.ErrNotOwner) && !errors.Is(err, redisstore.ErrNotReplicated) {
		if s.errors.Add(1) == 1 {
			s.first.Store(err.Error())
		}
	}
	return err
}

func (s *errCountingStore) Acquire(ctx context.Context, key, token, fp string, lease time.Duration) (idem.Record, bool, error) {
	rec, ok, err := s.Store.Acquire(ctx, key, token, fp, lease)
	return rec, ok, s.failed(err)
}

func (s *errCountingStore) Complete(ctx context.Context, key, token string, resp []byte, retention time.Duration) error {
	return s.failed(s.Store.Complete(ctx, key, token, resp, retention))
}

func (s *errCountingStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	return s.failed(s.Store.Extend(ctx, key, token, lease))
}

func (s *errCountingStore) Release(ctx context.Context, key, token string) error {
	return s.failed(s.Store.Release(ctx, key, token))
}

// clusterNode is one master of the private cluster, with a direct client.
type clusterNode struct {
	id, host, port string
	c              *redis.Client
}

// TestClusterReshardUnderLoad moves the slot holding live idempotency
// records (in progress and completed) from master to master, twice round
// the cluster, with CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE in small
// batches and SETSLOT NODE, while three engines (each with its own Cluster
// client) run a steady load of unique keys on it, each retried once after
// its first answer. Every record of the run shares one hash tag in the
// prefix, so the load and the migration meet on that slot and the clients
// are redirected (ASK while the slot migrates, MOVED after) all the time.
//
// Asserted: each key executed exactly once, each retry replayed its first
// answer, each record is completed with that answer at the end (no lost
// completion), and ASK and MOVED redirections did happen. Every redisstore
// script reads and writes one key, so Redis never answers TRYAGAIN (which
// is for multi-key commands whose keys are split by a migration); the count
// is reported. With WithWaitReplicas the completion pipeline goes straight
// to the slot's master and falls back to the cluster client on a
// redirection (this cluster has no replicas: every completion reports
// ErrNotReplicated, which the engine counts as completed).
func TestClusterReshardUnderLoad(t *testing.T) {
	t.Parallel()
	addrs := privateCluster(t)
	for _, tc := range []struct {
		name string
		opts []redisstore.Option
	}{
		{"plain", nil},
		{"wait-replicas", []redisstore.Option{redisstore.WithWaitReplicas(1, time.Millisecond)}},
	} {
		t.Run(tc.name, func(t *testing.T) { reshardUnderLoad(t, addrs, tc.opts) })
	}
}

func reshardUnderLoad(t *testing.T, addrs []string, opts []redisstore.Option) {
	hook := &redirectHook{}
	newClient := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true,
			NewClient: func(o *redis.Options) *redis.Client {
				n := redis.NewClient(o)
				n.AddHook(hook)
				return n
			}})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ctx := context.Background()
	tag := rand.Text()[:8]
	prefix := "idemtest:{" + tag + "}:"
	var nodes []*clusterNode
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = c.Close() })
		id, err := c.Do(ctx, "cluster", "myid").Text()
		if err != nil {
			t.Fatal(err)
		}
		host, port, _ := strings.Cut(a, ":")
		nodes = append(nodes, &clusterNode{id: id, host: host, port: port, c: c})
	}
	slot, err := nodes[0].c.ClusterKeySlot(ctx, prefix+"x").Result()
	if err != nil {
		t.Fatal(err)
	}
	owner := func() int {
		slots, err := nodes[0].c.ClusterSlots(ctx).Result() //nolint:staticcheck // CLUSTER SLOTS answers on Redis 6 too (CLUSTER SHARDS needs 7.0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) {
				for i, n := range nodes {
					if r.Nodes[0].ID == n.id {
						return i
					}
				}
			}
		}
		t.Fatalf("slot %d has no owner", slot)
		return -1
	}

	// Three engines, each with its own cluster client. A lost lease or a
	// store error at completion would be a lost completion: counted.
	var leaseLost, storeErrors atomic.Int64
	onEvent := idem.WithEventHook(func(_ context.Context, ev idem.Event) {
		switch ev.Kind {
		case idem.EventLeaseLost:
			leaseLost.Add(1)
		case idem.EventStoreError:
			storeErrors.Add(1)
		}
	})
	quiet := idem.WithLogger(slog.New(slog.DiscardHandler)) // WithWaitReplicas warns on every completion here
	engines := make([]*idem.Engine, 3)
	var stores []*errCountingStore
	for i := range engines {
		c := newClient()
		t.Cleanup(func() { deletePrefix(c, prefix) })
		store := &errCountingStore{Store: redisstore.New(c, append([]redisstore.Option{redisstore.WithPrefix(prefix)}, opts...)...)}
		stores = append(stores, store)
		e, err := idem.New(store, onEvent, quiet, idem.WithStoreTimeout(10*time.Second), idem.WithLease(time.Minute)) // lease >= 4 × store timeout
		if err != nil {
			t.Fatal(err)
		}
		engines[i] = e
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = e.Close(ctx)
		})
	}

	var (
		mu        sync.Mutex
		execs     = map[string]int{}    // key → executions
		originals = map[string]string{} // key → body of its first answer
		logical   atomic.Int64
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := "k-" + rand.Text()
				// The first answer, then one retry through another engine.
				var first string
				for attempt := 0; attempt < 2; {
					e := engines[(i+attempt)%3]
					x, resp := e.Begin(ctx, request(key, `{"amount":1}`))
					switch {
					case x != nil:
						mu.Lock()
						execs[key]++
						n := execs[key]
						mu.Unlock()
						time.Sleep(5 * time.Millisecond) // in progress while the slot moves
						body := fmt.Sprintf("%s#%d", key, n)
						x.Write([]byte(body))
						x.Finish(201, nil)
						if attempt == 0 {
							first = body
						}
						attempt++
					case resp.Status == 201 && attempt == 1:
						if string(resp.Body) != first || !resp.IsReplay() {
							t.Errorf("key %s: retry answered %q (replayed %v); want the replay of %q", key, resp.Body, resp.IsReplay(), first)
						}
						attempt++
					case resp.Status == 409: // the first is still completing: retry
						time.Sleep(5 * time.Millisecond)
					default:
						t.Errorf("key %s attempt %d: %d %s", key, attempt, resp.Status, resp.Body)
						return
					}
				}
				mu.Lock()
				originals[key] = first
				mu.Unlock()
				logical.Add(1)
			}
		})
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			wg.Wait()
		}
	}()

	waitKeys := func(n int64) {
		t.Helper()
		want := logical.Load() + n
		for deadline := time.Now().Add(60 * time.Second); logical.Load() < want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("load: fewer than %d keys in 60s", n)
			}
		}
	}
	waitKeys(50)
	// Three executions hold their leases through every move: in-progress
	// records the migration must carry, completed after it.
	type held struct {
		key string
		x   *idem.Execution
	}
	var holds []held
	for i := range 3 {
		key := "held-" + rand.Text()
		x, resp := engines[i].Begin(ctx, request(key, `{"amount":1}`))
		if x == nil {
			t.Fatalf("held key: %d %s", resp.Status, resp.Body)
		}
		holds = append(holds, held{key, x})
	}
	const moves = 3 // once round the three masters
	var migrated, inProgress int
	for range moves {
		src := owner()
		dst := (src + 1) % 3
		s, d := nodes[src], nodes[dst]
		asks := hook.ask.Load()
		do := func(n *clusterNode, args ...any) {
			t.Helper()
			if err := n.c.Do(ctx, args...).Err(); err != nil {
				t.Fatalf("%v on %s:%s: %v", args, n.host, n.port, err)
			}
		}
		do(d, "cluster", "setslot", slot, "importing", s.id)
		do(s, "cluster", "setslot", slot, "migrating", d.id)
		// Move the keys 100 at a time, holding the migrating state until the
		// load has been redirected with ASK at least once (or 10s passed),
		// so that requests meet the slot half moved.
		for deadline := time.Now().Add(10 * time.Second); ; {
			keys, err := s.c.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) > 0 {
				// Count the records in progress just before they move.
				states, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, k := range keys {
						p.GetRange(ctx, k, 0, 0) // the state byte
					}
					return nil
				})
				if err != nil && !errors.Is(err, redis.Nil) {
					t.Fatal(err)
				}
				for _, st := range states {
					if v, _ := st.(*redis.StringCmd).Result(); v == "1" {
						inProgress++
					}
				}
				args := []any{"migrate", d.host, d.port, "", 0, 5000, "keys"}
				for _, k := range keys {
					args = append(args, k)
				}
				do(s, args...)
				migrated += len(keys)
				continue
			}
			if hook.ask.Load() > asks || time.Now().After(deadline) {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		for _, n := range []*clusterNode{d, s, nodes[3-src-dst]} {
			do(n, "cluster", "setslot", slot, "node", d.id)
		}
		waitKeys(30)
	}
	close(stop)
	wg.Wait()
	for i, h := range holds {
		h.x.Write([]byte("held"))
		h.x.Finish(201, nil)
		x, resp := engines[(i+1)%3].Begin(ctx, request(h.key, `{"amount":1}`))
		if x != nil || resp.Status != 201 || string(resp.Body) != "held" {
			t.Errorf("held key %d after the moves: executed %v, %d %q; want the replay of its completion", i, x != nil, resp.Status, resp.Body)
		}
	}

	// Every key executed once, its completion is where the cluster says.
	check := redisstore.New(newClient(), redisstore.WithPrefix(prefix))
	doubles, lost := 0, 0
	for key, first := range originals {
		if execs[key] != 1 {
			doubles++
			t.Errorf("key %s executed %d times", key, execs[key])
		}
		rec, found, err := check.Get(ctx, idem.ScopedKey("alice", "POST", "/v1/payments", key))
		var body []byte
		if resp, derr := idem.DecodeResponse(rec.Response); derr == nil {
			body = resp.Body
		}
		if err != nil || !found || rec.State != idem.StateCompleted || string(body) != first {
			lost++
			t.Errorf("key %s: record %+v found %v err %v; want completed with %q", key, rec, found, err, first)
		}
	}
	if hook.ask.Load() == 0 || hook.moved.Load() == 0 {
		t.Errorf("redirections: ASK %d, MOVED %d; the load did not meet the migration", hook.ask.Load(), hook.moved.Load())
	}
	if inProgress < len(holds)*moves {
		t.Errorf("%d in-progress records migrated; the %d held ones alone make %d", inProgress, len(holds), len(holds)*moves)
	}
	if n, m := leaseLost.Load(), storeErrors.Load(); n != 0 || m != 0 {
		t.Errorf("engines reported %d lost leases and %d store errors", n, m)
	}
	// The store itself follows every redirection: no call failed (the
	// engine's completion retries would otherwise hide a failed one).
	for i, st := range stores {
		if n := st.errors.Load(); n != 0 {
			t.Errorf("store %d: %d calls failed, the first: %v", i, n, st.first.Load())
		}
	}
	t.Logf("RESULT slot %d moved %d times under load (MIGRATE moved %d records, %d of them in progress): %d logical requests, %d executed twice, %d lost completions; redirections ASK %d, MOVED %d, TRYAGAIN %d",
		slot, moves, migrated, inProgress, len(originals), doubles, lost, hook.ask.Load(), hook.moved.Load(), hook.tryAgain.Load())
}

// TestClusterWaitReplicasDuringMigration completes, under WithWaitReplicas,
// a record that a migration already moved to the importing master while its
// slot is still the source master's. The source has a replica, the
// importing master none: WAIT must be counted where the record was written,
// on the connection that wrote it (after ASK), so the completion is
// reported not replicated; a WAIT sent to the source, or on another
// connection, answers at once that its replica is up to date.
func TestClusterWaitReplicasDuringMigration(t *testing.T) {
	t.Parallel()
	addrs := privateCluster(t)
	ctx := ctxT(t)
	var nodes []*clusterNode
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = c.Close() })
		id, err := c.Do(ctx, "cluster", "myid").Text()
		if err != nil {
			t.Fatal(err)
		}
		host, port, _ := strings.Cut(a, ":")
		nodes = append(nodes, &clusterNode{id: id, host: host, port: port, c: c})
	}
	prefix := "idemtest:{" + rand.Text()[:8] + "}:"
	slot, err := nodes[0].c.ClusterKeySlot(ctx, prefix+"x").Result()
	if err != nil {
		t.Fatal(err)
	}
	var src, dst *clusterNode
	for i, n := range nodes {
		slots, err := n.c.ClusterSlots(ctx).Result() //nolint:staticcheck // as above: Redis 6 has no CLUSTER SHARDS
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) && r.Nodes[0].ID == n.id {
				src, dst = n, nodes[(i+1)%3]
			}
		}
	}
	if src == nil {
		t.Fatalf("slot %d has no owner", slot)
	}

	// A replica for the source master only.
	port, err := findPort(true)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rp, err := startRedis(binary(t, "redis-server"), port, dir, "--cluster-enabled", "yes",
		"--cluster-config-file", dir+"/nodes.conf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rp.stop)
	rc := redis.NewClient(&redis.Options{Addr: rp.addr})
	t.Cleanup(func() { _ = rc.Close() })
	if err := rc.ClusterMeet(ctx, src.host, src.port).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		nodesText, _ := rc.ClusterNodes(ctx).Result()
		if strings.Contains(nodesText, src.id) && rc.ClusterReplicate(ctx, src.id).Err() == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica did not learn of %s: %s", src.id, nodesText)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info, _ := src.c.Info(ctx, "replication").Result()
		if strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica of the source master not online: %s", info)
		}
	}

	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s := redisstore.New(c, redisstore.WithPrefix(prefix), redisstore.WithWaitReplicas(1, 200*time.Millisecond))
	// up waits longer for the replica that is up: its ack takes long on a
	// loaded machine (make test-under-load)
	up := redisstore.New(c, redisstore.WithPrefix(prefix), redisstore.WithWaitReplicas(1, 2*time.Second))
	resp := []byte("ok")
	// Before the migration: the source's replica acknowledges.
	k0, k1 := "k0", "k1"
	for _, k := range []string{k0, k1} {
		if _, ok, err := s.Acquire(ctx, k, "tok-"+k, "fp", time.Minute); err != nil || !ok {
			t.Fatalf("Acquire %s = %v, %v", k, ok, err)
		}
	}
	if err := up.Complete(ctx, k0, "tok-"+k0, resp, time.Hour); err != nil {
		t.Fatalf("Complete on the source with its replica up: %v", err)
	}

	// Migrate k1, in progress, to dst; the slot stays the source's.
	do := func(n *clusterNode, args ...any) {
		t.Helper()
		if err := n.c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	do(dst, "cluster", "setslot", slot, "importing", src.id)
	do(src, "cluster", "setslot", slot, "migrating", dst.id)
	do(src, "migrate", dst.host, dst.port, "", 0, 5000, "keys", prefix+k1)
	err = s.Complete(ctx, k1, "tok-"+k1, resp, time.Hour)
	if !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Complete of a record moved to a master without replicas = %v; want ErrNotReplicated", err)
	}
	do(src, "migrate", dst.host, dst.port, "", 0, 5000, "keys", prefix+k0)
	for _, n := range nodes {
		do(n, "cluster", "setslot", slot, "node", dst.id)
	}
	if rec, found, err := s.Get(ctx, k1); err != nil || !found || rec.State != idem.StateCompleted || string(rec.Response) != "ok" {
		t.Fatalf("Get after the migration = %+v, %v, %v; want completed", rec, found, err)
	}
}
