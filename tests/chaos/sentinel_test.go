package chaos

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSentinelFailover runs three example instances (examples/payments -framework nethttp) on
// redisstore through go-redis's Sentinel failover client
// (redis.NewFailoverClient, selected by -redis-url ...?master_name=...), in
// front of a primary, one replica and three sentinels of the test's own.
// A steady load of unique keys runs, each key sent until its first 201 and
// then retried once more through another instance; mid-load the primary is
// failed over, by SENTINEL FAILOVER or by SIGKILL (restarted empty once the
// load runs on the new master, to rejoin as a replica). It counts the answers, the 503s during the switch,
// the seconds until the load is served again and the keys executed twice
// (two distinct payment ids), with and without redisstore.WithWaitReplicas.
//
// Asserted, because it must hold whatever the timing: every key is
// eventually answered 201; every execution is seen by a client (instance
// counters equal the distinct payment ids); no key whose record had reached
// the replica before the failover is executed twice. Keys written during the
// switch may be executed twice (asynchronous replication; see
// stores/redisstore/README.md): they are counted and logged, not asserted.
//
// `make test` runs one failover per case; `make soak` (-soak=D) repeats
// failovers of each kind for D per case.
func TestSentinelFailover(t *testing.T) {
	for _, kind := range []string{"sentinel-failover", "sigkill"} {
		for _, m := range failoverModes {
			t.Run(kind+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				sentinelScenario(t, kind, m)
			})
		}
	}
}

// failoverMode is a store configuration under test.
type failoverMode struct {
	name        string
	wait        bool // the instances run with -redis-wait-replicas 1 (WAIT timeout 500ms)
	description string
}

var failoverModes = []failoverMode{
	{name: "no-wait", description: "without WithWaitReplicas"},
	{name: "wait-replicas", wait: true, description: "WithWaitReplicas(1, 500ms)"},
}

// sentinelSet is a primary, a replica and three sentinels monitoring them
// as master "idem-<random hex>", its own per set.
type sentinelSet struct {
	t         *testing.T
	nodes     []*redisServer // the two data nodes; which is primary changes
	sentinels []*sentinelProc
	// master is the name the sentinels monitor the data nodes under, its
	// own per set: sentinels ignore the hello messages of another master
	// name, so two sets never join even when a port of one set's dead
	// server is taken by another set's.
	master string
}

func startSentinelSet(t *testing.T) *sentinelSet {
	t.Helper()
	server := []string{"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}
	primary := startRedis(t, server...)
	replica := startRedis(t, append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.port)}, server...)...)
	s := &sentinelSet{t: t, nodes: []*redisServer{primary, replica}, master: "idem-" + hexID()}
	for range 3 {
		s.sentinels = append(s.sentinels, startSentinel(t, primary, s.master))
	}
	if p := s.waitHealthy(); p != primary {
		t.Fatalf("the sentinels chose %s as the master; want %s", p.Addr(), primary.Addr())
	}
	return s
}

// sentinelProc is a redis-server --sentinel process.
type sentinelProc struct {
	port int
	cmd  *exec.Cmd
	done chan struct{}
	log  string
	c    *redis.SentinelClient
}

// startSentinel starts a sentinel monitoring primary on a free port. A port
// that another test's server took between freePort and the sentinel's bind
// makes that sentinel exit at once: it is started again on another port.
func startSentinel(t *testing.T, primary *redisServer, master string) *sentinelProc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		sp := tryStartSentinel(t, primary, master)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := sp.c.Ping(ctx).Err()
		for err != nil && ctx.Err() == nil {
			select {
			case <-sp.done: // exited: its port was taken
				cancel()
				log, _ := os.ReadFile(sp.log)
				if attempt == 3 {
					t.Fatalf("sentinel exited at start three times; last log:\n%s", log)
				}
				t.Logf("sentinel on port %d exited at start (port taken?); starting another: %s", sp.port, log)
				err = nil
				sp = nil
			case <-time.After(50 * time.Millisecond):
				err = sp.c.Ping(ctx).Err()
			}
			if sp == nil {
				break
			}
		}
		cancel()
		if sp == nil {
			continue
		}
		if err != nil {
			t.Fatalf("sentinel on port %d does not answer: %v", sp.port, err)
		}
		return sp
	}
}

func tryStartSentinel(t *testing.T, primary *redisServer, master string) *sentinelProc {
	t.Helper()
	dir := t.TempDir()
	sp := &sentinelProc{port: freePort(t), done: make(chan struct{}), log: filepath.Join(dir, "sentinel.log")}
	conf := filepath.Join(dir, "sentinel.conf")
	// down-after 1.5s: a dead primary is noticed quickly, a busy one (2
	// shared cores) is not taken for dead; failover-timeout 3s also spaces
	// two failovers of the master by 6s (2×).
	text := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s 1500
sentinel failover-timeout %s 3000
sentinel parallel-syncs %s 1
`, sp.port, dir, sp.log, master, primary.port, master, master, master)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	sp.cmd = exec.Command(primary.bin, conf, "--sentinel")
	sp.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := sp.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = sp.cmd.Wait(); close(sp.done) }()
	sp.c = redis.NewSentinelClient(&redis.Options{Addr: sp.addr(), MaxRetries: -1})
	t.Cleanup(func() {
		_ = sp.c.Close()
		_ = sp.cmd.Process.Kill()
		<-sp.done
	})
	return sp
}

func (sp *sentinelProc) addr() string { return "127.0.0.1:" + strconv.Itoa(sp.port) }

// url is the -redis-url of the example services: the failover client,
// seeded with every sentinel.
func (s *sentinelSet) url() string {
	u := "redis://" + s.sentinels[0].addr() + "/0?master_name=" + s.master
	for _, sp := range s.sentinels[1:] {
		u += "&addr=" + sp.addr()
	}
	return u
}

// masterAddr returns the master address every sentinel agrees on, or "".
func (s *sentinelSet) masterAddr(ctx context.Context) string {
	var agreed string
	for i, sp := range s.sentinels {
		a, err := sp.c.GetMasterAddrByName(ctx, s.master).Result()
		if err != nil || len(a) != 2 {
			return ""
		}
		addr := a[0] + ":" + a[1]
		if i > 0 && addr != agreed {
			return ""
		}
		agreed = addr
	}
	return agreed
}

// other returns the data node that is not n.
func (s *sentinelSet) other(n *redisServer) *redisServer {
	if s.nodes[0] == n {
		return s.nodes[1]
	}
	return s.nodes[0]
}

// primary returns the data node the sentinels agree is the master.
func (s *sentinelSet) primary(ctx context.Context) *redisServer {
	a := s.masterAddr(ctx)
	for _, n := range s.nodes {
		if n.Addr() == a {
			return n
		}
	}
	return nil
}

// waitHealthy polls (up to 60s) until every sentinel names the same data
// node as the master, knows the two other sentinels and sees the other node
// as an online replica, and the replica's link is up: the state in which
// both SENTINEL FAILOVER and a detected failure can promote it. It returns
// the master.
func (s *sentinelSet) waitHealthy() *redisServer {
	s.t.Helper()
	ctx := context.Background()
	var why string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		why = ""
		primary := s.primary(ctx)
		if primary == nil {
			why = "the sentinels do not agree on a master"
			continue
		}
		replica := s.other(primary)
		for _, sp := range s.sentinels {
			others, err := sp.c.Sentinels(ctx, s.master).Result()
			if err != nil || len(others) != 2 {
				why = fmt.Sprintf("sentinel %s knows %d other sentinels (%v)", sp.addr(), len(others), err)
				break
			}
			reps, err := sp.c.Replicas(ctx, s.master).Result()
			ok := false
			for _, r := range reps {
				if r["ip"]+":"+r["port"] == replica.Addr() && r["flags"] == "slave" && r["master-link-status"] == "ok" {
					ok = true
				}
			}
			if err != nil || !ok {
				why = fmt.Sprintf("sentinel %s does not see %s as an online replica: %v %v", sp.addr(), replica.Addr(), reps, err)
				break
			}
		}
		if why != "" {
			continue
		}
		info, _ := replica.c.Info(ctx, "replication").Result()
		if !strings.Contains(info, "master_link_status:up") || !strings.Contains(info, "master_port:"+strconv.Itoa(primary.port)) {
			why = "replica link not up: " + info
			continue
		}
		return primary
	}
	s.t.Fatalf("Sentinel set not healthy within 60s: %s", why)
	return nil
}

// synced polls until the replica's replication offset reaches the
// primary's offset at the time of the call: every write acknowledged before
// the call is on the replica.
func (s *sentinelSet) synced(primary *redisServer) {
	s.t.Helper()
	ctx := context.Background()
	offset := func(c *redis.Client, field string) int64 {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			s.t.Fatal(err)
		}
		for _, l := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(l, field+":"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		s.t.Fatalf("no %s in %s", field, info)
		return 0
	}
	want := offset(primary.c, "master_repl_offset")
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if offset(s.other(primary).c, "slave_repl_offset") >= want {
			return
		}
	}
	s.t.Fatalf("replica did not reach offset %d within 20s", want)
}

// keyRun is what the clients saw for one key.
type keyRun struct {
	started, firstOK time.Time
	answers          []answer
	ids              []string // distinct payment ids of its 201s
}

// failoverLoad is the steady load: workers each run one key at a time
// through the instances in turn.
type failoverLoad struct {
	urls []string
	user string

	mu   sync.Mutex
	runs []*keyRun
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func startFailoverLoad(urls []string, workers int) *failoverLoad {
	l := &failoverLoad{urls: urls, user: "u" + hexID(), stop: make(chan struct{})}
	for w := range workers {
		l.wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				l.key(i)
			}
		})
	}
	return l
}

// key sends one new key until its first 201, then once more through the
// next instance (until that retry too is answered 201), pausing 50ms after
// a 409 or 503, for at most 60s.
func (l *failoverLoad) key(i int) {
	r := &keyRun{started: time.Now()}
	l.mu.Lock()
	l.runs = append(l.runs, r)
	l.mu.Unlock()
	key, oks := newKey(), 0
	for deadline := time.Now().Add(60 * time.Second); oks < 2 && time.Now().Before(deadline); i++ {
		a := pay(l.urls[i%len(l.urls)], l.user, key, 1000)
		l.mu.Lock()
		r.answers = append(r.answers, a)
		if a.err == nil && a.status == http.StatusCreated {
			oks++
			if oks == 1 {
				r.firstOK = a.at.Add(a.took)
			}
			if !slices.Contains(r.ids, a.id) {
				r.ids = append(r.ids, a.id)
			}
		}
		l.mu.Unlock()
		if a.err != nil || a.status != http.StatusCreated {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// done returns the number of keys whose first 201 arrived after t.
func (l *failoverLoad) doneAfter(t time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.runs {
		if !r.firstOK.IsZero() && r.firstOK.After(t) {
			n++
		}
	}
	return n
}

// waitDone polls until n keys got their first 201 after t (up to 60s).
func (l *failoverLoad) waitDone(t *testing.T, after time.Time, n int) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if l.doneAfter(after) >= n {
			return
		}
	}
	t.Fatalf("load: fewer than %d keys answered 201 within 60s after %v", n, after)
}

// finish stops the load (once) and returns every key's run.
func (l *failoverLoad) finish() []*keyRun {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
	return l.runs
}

// failoverRound is one failover and what the load saw around it.
type failoverRound struct {
	from, replicated, start, to time.Time     // keys started in [from, to) belong to it
	switched                    time.Duration // until the sentinels agreed on the new master

	keys, answered, unavailable, conflicts, failed int           // keys; answers; 503s; 409s; transport errors
	recovered, slowest                             time.Duration // until the end of the last 503 or error; the slowest answer
	doubles, earlyDoubles                          int           // keys executed twice; of which replicated before the failover
}

func sentinelScenario(t *testing.T, kind string, m failoverMode) {
	set := startSentinelSet(t)
	// The lease outlasts the switch (a SIGKILL takes about 2-3s to be
	// detected and failed over): an in-progress record whose lease lapses
	// during the outage lets the retry execute again.
	args := []string{"-store", "redis", "-redis-url", set.url(),
		"-charge-latency", "20ms", "-lease", "10s", "-store-timeout", "1s"}
	if m.wait {
		args = append(args, "-redis-wait-replicas", "1")
	}
	insts := make([]*service, 3)
	urls := make([]string, 3)
	for i := range insts {
		insts[i] = startService(t, "nethttp", "", args...)
		urls[i] = insts[i].URL
	}
	ctx := context.Background()
	load := startFailoverLoad(urls, 6)
	defer load.finish() // idempotent

	var soakEnd time.Time
	if *soakFor > 0 {
		soakEnd = time.Now().Add(*soakFor)
	}
	var rounds []*failoverRound
	from := time.Now()
	for n := 0; n < 1 || time.Now().Before(soakEnd); n++ {
		primary := set.waitHealthy()
		load.waitDone(t, time.Now(), 30) // steady load before the failover
		set.synced(primary)              // records written so far are on the replica
		r := &failoverRound{from: from, replicated: time.Now()}
		load.waitDone(t, r.replicated, 10)
		r.start = time.Now()
		switch kind {
		case "sentinel-failover":
			if err := set.sentinels[n%3].c.Failover(ctx, set.master).Err(); err != nil {
				t.Fatalf("SENTINEL FAILOVER: %v", err)
			}
		case "sigkill":
			primary.kill()
		}
		promoted := set.other(primary)
		for deadline := time.Now().Add(60 * time.Second); set.masterAddr(ctx) != promoted.Addr(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d (%s): the sentinels did not switch to %s within 60s", n, kind, promoted.Addr())
			}
		}
		r.switched = time.Since(r.start)
		load.waitDone(t, time.Now(), 30) // served again, steadily
		if kind == "sigkill" {
			// Back once the instances run on the new master (a crashed
			// server returns after a while): empty, without persistence,
			// the sentinels make it a replica of the new master.
			primary.start()
		}
		r.to = time.Now()
		from = r.to
		rounds = append(rounds, r)
	}
	runs := load.finish()

	var execSeen int64
	for _, k := range runs {
		execSeen += int64(len(k.ids))
		if k.firstOK.IsZero() {
			t.Errorf("key started %s never answered 201: %s", k.started.Format(time.StampMilli), seq(k.answers))
		}
		r := rounds[len(rounds)-1]
		for _, c := range rounds {
			if k.started.Before(c.to) {
				r = c
				break
			}
		}
		r.keys++
		if len(k.ids) > 1 {
			r.doubles++
			t.Logf("executed twice: key started at %+.3fs, first 201 at %+.3fs from the failover: %s",
				k.started.Sub(r.start).Seconds(), k.firstOK.Sub(r.start).Seconds(), timeline(k.answers, r.start))
			if k.firstOK.Before(r.replicated) {
				r.earlyDoubles++
				t.Errorf("key answered 201 at %s, replicated before the failover at %s, executed again: %s",
					k.firstOK.Format(time.StampMilli), r.start.Format(time.StampMilli), seq(k.answers))
			}
		}
		for _, a := range k.answers {
			switch {
			case a.err != nil:
				r.failed++
			case a.status == http.StatusServiceUnavailable:
				r.unavailable++
			case a.status == http.StatusConflict:
				r.conflicts++
			}
			if a.err == nil {
				r.answered++
			}
			r.slowest = max(r.slowest, a.took)
			if (a.err != nil || a.status == http.StatusServiceUnavailable) && a.at.Add(a.took).After(r.start) {
				r.recovered = max(r.recovered, a.at.Add(a.took).Sub(r.start))
			}
		}
	}
	var executed int64
	for _, in := range insts {
		executed += in.executions()
	}
	if executed != execSeen {
		t.Errorf("the instances executed %d times, clients saw %d distinct payments", executed, execSeen)
	}
	mode := m.description
	for i, r := range rounds {
		t.Logf("RESULT %s, %s, round %d: keys %d, answers %d, 503s %d, 409s %d, transport errors %d, sentinels switched after %.1fs, last 503 ended %.1fs after the failover, slowest answer %.1fs, executed twice %d",
			kind, mode, i+1, r.keys, r.answered, r.unavailable, r.conflicts, r.failed, r.switched.Seconds(), r.recovered.Seconds(), r.slowest.Seconds(), r.doubles)
	}
	for _, in := range insts {
		in.stop()
	}
}

// timeline lists answers with their start, relative to t0.
func timeline(as []answer, t0 time.Time) string {
	var parts []string
	for _, a := range as {
		s := fmt.Sprintf("%+.3fs %s", a.at.Sub(t0).Seconds(), a)
		if a.id != "" {
			s += " " + a.id
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}
