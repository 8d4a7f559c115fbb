package chaos

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	tpclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/redisstore"
)

// TestHalfBrokenConnection breaks one direction of the connection to Redis.
// Every redisstore operation is one script (EVALSHA), a read and a write in
// one command, so "reads fail while writes work" is emulated by cutting the
// reply direction (downstream: the script runs, its answer is lost) and the
// reverse by cutting the request direction (upstream: the script never
// runs). Either way a store error must never count as "not found": a
// completed key is not executed again (503, then its replay), and a fresh
// key executes once after the fault (409 first while the lease its acquire
// left, if it ran, is not yet released in the background).
func TestHalfBrokenConnection(t *testing.T) {
	modes := []fault{
		{"reply-reset", "reset_peer", "downstream", tpclient.Attributes{"timeout": 0}},
		{"reply-dropped", "timeout", "downstream", tpclient.Attributes{"timeout": 0}},
		{"request-reset", "reset_peer", "upstream", tpclient.Attributes{"timeout": 0}},
		{"request-dropped", "timeout", "upstream", tpclient.Attributes{"timeout": 0}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			a, px, be := slowService(t, "100ms")
			user := "u" + hexID()
			done, fresh := newKey(), newKey()
			first := pay(a.URL, user, done, 1000)
			if first.status != http.StatusCreated {
				t.Fatalf("before the fault: %v", first)
			}
			remove := px.toxic(m.kind, m.stream, m.attrs)
			// The fresh key first, on the pooled connection: a new connection's
			// handshake fails under the fault before any script is sent.
			fr := pay(a.URL, user, fresh, 1000)
			dup := pay(a.URL, user, done, 1000)
			remove()
			if dup.status != http.StatusServiceUnavailable || fr.status != http.StatusServiceUnavailable {
				t.Fatalf("%s: completed key %v, fresh key %v; want 503 for both", m.name, dup, fr)
			}
			if n := a.executions(); n != 2 {
				t.Fatalf("%s: executions %d during the fault, want 2 (warm-up, first)", m.name, n)
			}
			if r := pay(a.URL, user, done, 1000); !r.replayed || r.id != first.id {
				t.Errorf("completed key after the fault: %v id %q, want replay %q", r, r.id, first.id)
			}
			retries := settle(a.URL, user, fresh, 1000, slowLease+15*time.Second)
			last := retries[len(retries)-1]
			if last.status != http.StatusCreated || last.replayed {
				t.Fatalf("fresh key after the fault: %s", seq(retries))
			}
			for _, r := range retries[:len(retries)-1] {
				if r.status != http.StatusConflict {
					t.Errorf("fresh key after the fault: %s, want 409s (an orphan lease) then 201", seq(retries))
				}
			}
			// When the reply was cut the acquire did run: its orphan lease
			// answers 409 until the engine's background release (or the
			// lease) removes it. When the request was cut nothing ran.
			if applied := len(retries) > 1; applied && m.stream == "upstream" {
				t.Errorf("%s: retries %s: a request that never reached Redis left a lease", m.name, seq(retries))
			}
			if n := a.executions(); n != 3 {
				t.Errorf("executions %d, want 3", n)
			}
			t.Logf("%s (%s %s): completed key 503 (%v) then replay; fresh key 503 (%v), then %s",
				m.name, m.kind, m.stream, dup.took.Round(time.Millisecond), fr.took.Round(time.Millisecond), seq(retries))
			checkSettled(t, a, be)
		})
	}
}

// TestPartitionedInstanceLosesLease cuts one instance off the store while
// its handler runs (each instance has its own proxy): its lease renewals
// fail, the lease lapses, and a retry through a healthy instance executes
// while the first still runs. The double execution is asserted because it
// is inherent to leases without fencing; the partitioned instance's
// completion is then refused (lease lost) and the healthy one's is kept.
func TestPartitionedInstanceLosesLease(t *testing.T) {
	t.Parallel()
	be := redisBackend(t)
	pa, pb := newProxy(t, be.addr), newProxy(t, be.addr)
	args := []string{"-charge-latency", "3s", "-lease", "1200ms", "-store-timeout", "300ms"}
	a := startService(t, "nethttp", "", append(be.flags(pa.Addr()), args...)...)
	b := startService(t, "nethttp", "", append(be.flags(pb.Addr()), args...)...)
	user, key := "u"+hexID(), newKey()
	firstc := async(a.URL, user, key, 1000)
	a.waitExecutions(1)
	remove := pa.toxic("timeout", "upstream", tpclient.Attributes{"timeout": 0})
	cut := time.Now()
	retries := settle(b.URL, user, key, 1000, 20*time.Second)
	second := retries[len(retries)-1]
	first := <-firstc
	remove()
	t.Logf("partition: a cut off mid-handler; retries through b: %s (executed %v after the cut, lease 1.2s); a answered %v; executions a=%d b=%d; a's log: %s",
		seq(retries), second.at.Sub(cut).Round(time.Millisecond), first, a.executions(), b.executions(), lastLines(a.logs(), 1))
	if second.status != http.StatusCreated || second.replayed {
		t.Fatalf("retry through the healthy instance: %s", seq(retries))
	}
	if first.status != http.StatusCreated || first.id == second.id {
		t.Fatalf("partitioned instance answered %v", first)
	}
	if a.executions()+b.executions() != 2 {
		t.Errorf("executions %d+%d, want 2 (the double execution)", a.executions(), b.executions())
	}
	if r := pay(b.URL, user, key, 1000); !r.replayed || r.id != second.id {
		t.Errorf("replay: %v id %q, want the healthy instance's %q", r, r.id, second.id)
	}
	if l := a.logs(); !strings.Contains(l, "lease") {
		t.Errorf("the partitioned instance logged no lost lease:\n%s", l)
	}
	t.Logf("DOUBLE EXECUTION: an instance cut off from the store for longer than the lease while its handler runs")
}

// TestRedisRestartLosesRecords restarts Redis without persistence under a
// small load: completed records are lost, so every retry executes again
// (asserted: this is what happens without persistence or replication).
// With appendfsync always, the same crash loses nothing.
func TestRedisRestartLosesRecords(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		durable bool
	}{
		{"no-persistence", nil, false},
		{"aof-always", []string{"--appendonly", "yes", "--appendfsync", "always"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := startRedis(t, tc.args...)
			a := startService(t, "nethttp", "", "-store", "redis", "-redis-url", "redis://"+r.Addr()+"/0",
				"-charge-latency", "300ms", "-lease", "2s", "-store-timeout", "500ms")
			user := "u" + hexID()
			const done, inflight = 20, 5
			keys := make([]string, done+inflight)
			ids := make([]string, len(keys))
			for i := range keys {
				keys[i] = newKey()
			}
			var wg sync.WaitGroup
			for i := 0; i < done; i++ {
				wg.Go(func() { ids[i] = pay(a.URL, user, keys[i], 1000).id })
			}
			wg.Wait()
			for i := done; i < len(keys); i++ {
				wg.Go(func() { ids[i] = pay(a.URL, user, keys[i], 1000).id })
			}
			a.waitExecutions(int64(len(keys))) // in flight: acquired, in the provider
			r.kill()
			r.start()
			wg.Wait()
			for i, id := range ids {
				if id == "" {
					t.Fatalf("request %d got no payment", i)
				}
			}
			reexec := 0
			for i, k := range keys {
				as := settle(a.URL, user, k, 1000, 20*time.Second)
				last := as[len(as)-1]
				switch {
				case last.status == http.StatusCreated && last.replayed && last.id == ids[i]:
				case last.status == http.StatusCreated && !last.replayed && last.id != ids[i]:
					reexec++
				default:
					t.Fatalf("retry %d after the restart: %s", i, seq(as))
				}
			}
			n := a.executions()
			t.Logf("%s: Redis SIGKILLed and restarted with %d completed and %d in-flight requests; retries executed again: %d; executions %d",
				tc.name, done, inflight, reexec, n)
			if tc.durable {
				// The in-flight ones complete after the restart: AOF kept their leases.
				if reexec != 0 || n != int64(len(keys)) {
					t.Errorf("with appendfsync always: %d re-executions, executions %d", reexec, n)
				}
			} else if reexec != len(keys) || n != int64(2*len(keys)) {
				t.Errorf("without persistence: %d of %d keys re-executed, executions %d; want all (the records were lost)", reexec, len(keys), n)
			}
			a.stop()
		})
	}
}

// TestWaitReplicas shows redisstore.WithWaitReplicas on one machine: a
// replica redis-server acknowledges completions (WAIT 1 succeeds), the
// record survives promoting the replica; with the replica stopped the
// completion is stored on the primary but reported as not replicated
// (ErrNotReplicated, which is idem.ErrNotDurable) and replays all the same.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	primary := startRedis(t)
	replica := startRedis(t, "--replicaof", "127.0.0.1", strings.Split(primary.Addr(), ":")[1])
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info, _ := replica.c.Info(ctx, "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica did not sync: %s", info)
		}
	}

	// The store itself.
	pc := redis.NewClient(&redis.Options{Addr: primary.Addr()})
	defer pc.Close()
	s := redisstore.New(pc, redisstore.WithWaitReplicas(1, 300*time.Millisecond))
	complete := func() (string, time.Duration, error) {
		key, token := newKey(), newKey()
		if _, ok, err := s.Acquire(ctx, key, token, "fp", time.Minute); err != nil || !ok {
			t.Fatalf("acquire: %v %v", ok, err)
		}
		start := time.Now()
		err := s.Complete(ctx, key, token, []byte("ok"), time.Hour)
		return key, time.Since(start), err
	}
	k1, took, err := complete()
	if err != nil {
		t.Fatalf("with a replica: %v", err)
	}
	if st, _ := replica.c.GetRange(ctx, redisstore.DefaultPrefix+k1, 0, 0).Result(); st != "2" {
		t.Errorf("the replica has state %q for an acknowledged completion", st)
	}
	t.Logf("WAIT 1 with a live replica: Complete %v", took.Round(time.Microsecond))

	// Through the example service.
	a := startService(t, "nethttp", "", "-store", "redis", "-redis-url", "redis://"+primary.Addr()+"/0",
		"-redis-wait-replicas", "1", "-charge-latency", "10ms", "-store-timeout", "2s")
	user := "u" + hexID()
	acked := pay(a.URL, user, newKey(), 1000)
	if acked.status != http.StatusCreated {
		t.Fatalf("with a replica: %v", acked)
	}

	// Failover: the acknowledged record is on the replica; promote it live.
	if err := replica.c.Do(ctx, "replicaof", "no", "one").Err(); err != nil {
		t.Fatal(err)
	}
	if rec, ok, err := redisstore.New(replica.c).Get(ctx, k1); err != nil || !ok || rec.State != idem.StateCompleted || string(rec.Response) != "ok" {
		t.Errorf("promoted replica: %+v %v %v, want the acknowledged completion", rec, ok, err)
	}
	replica.kill()
	k2, took, err := complete()
	if !errors.Is(err, redisstore.ErrNotReplicated) || !errors.Is(err, idem.ErrNotDurable) {
		t.Fatalf("replica stopped: Complete returned %v, want ErrNotReplicated", err)
	}
	if took < 300*time.Millisecond {
		t.Errorf("Complete returned after %v, before the WAIT timeout", took)
	}
	if rec, ok, err := s.Get(ctx, k2); err != nil || !ok || rec.State != idem.StateCompleted {
		t.Errorf("not-replicated completion on the primary: %+v %v %v, want completed", rec, ok, err)
	}
	t.Logf("replica stopped: Complete %v: %v", took.Round(time.Millisecond), err)
	key := newKey()
	lone := pay(a.URL, user, key, 1000)
	replay := pay(a.URL, user, key, 1000)
	if lone.status != http.StatusCreated || !replay.replayed || replay.id != lone.id {
		t.Errorf("replica stopped: %v then %v (ids %q %q), want 201 then its replay", lone, replay, lone.id, replay.id)
	}
	if l := a.logs(); !strings.Contains(l, "durability not confirmed") {
		t.Errorf("the service did not log the unconfirmed durability:\n%s", l)
	}
	if n := a.executions(); n != 2 {
		t.Errorf("executions %d, want 2", n)
	}
	t.Logf("example with -redis-wait-replicas 1: replica up 201 in %v; replica down 201 in %v (WAIT timeout 500ms), logged, replayed; executions 2",
		acked.took.Round(time.Millisecond), lone.took.Round(time.Millisecond))
	a.stop()
}
