package linear

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/anishathalye/porcupine"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/mongostore"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

var (
	duration = flag.Duration("robust.duration", 6*time.Second, "how long each store is driven under faults (make robustness: minutes)")
	histDur  = flag.Duration("robust.history", 1500*time.Millisecond, "how long one history is recorded (its operations are checked together)")
	seedFlag = flag.Uint64("robust.seed", 1, "seed of the clients' and the faults' random choices (a failing seed is a real fault)")
	saveAll  = flag.Bool("robust.save", false, "save every history to testdata/found, linearizable or not (samples for testdata/histories)")
)

// Servers, as `make test` exports them (scripts/services.sh):
// IDEM_REDIS_URL, IDEM_MONGO_URI, IDEM_POSTGRES_URL, IDEM_MYSQL_DSN; an
// unset variable falls back to the local default (Mongo: none, skipped
// unless CI=true). redis-server (PATH) is started on its own port for the
// restart faults.
func TestMain(m *testing.M) {
	_ = mysql.SetLogger(log.New(io.Discard, "", 0)) // every reset connection is logged otherwise
	zerolog.SetGlobalLevel(zerolog.WarnLevel)       // toxiproxy's toxics trace to the global logger
	goleak.VerifyTestMain(m,
		// toxiproxy leaves a toxic's pipe goroutine blocked on a send when
		// the toxic is removed while its connection is blocked (its own
		// goroutines, stopped with no way to wait for them).
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
		goleak.Cleanup(func(code int) {
			printSummary()
			os.Exit(code)
		}))
}

var (
	summaryMu sync.Mutex
	summary   = map[string]*stats{}
	faultsMu  sync.Mutex
	faultSeen = map[string]int{}
)

func statsFor(store string) *stats {
	summaryMu.Lock()
	defer summaryMu.Unlock()
	if summary[store] == nil {
		summary[store] = &stats{}
	}
	return summary[store]
}

func printSummary() {
	summaryMu.Lock()
	defer summaryMu.Unlock()
	if len(summary) == 0 {
		return
	}
	names := make([]string, 0, len(summary))
	for n := range summary {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Println("linearizability: store            histories  operations  contended  lapsed  completed  takeovers  claims  fenced  unknown  faults  restarts  undecided  anomalies")
	for _, n := range names {
		s := summary[n]
		fmt.Printf("linearizability: %-16s %10d %11d %10d %7d %10d %10d %7d %7d %8d %7d %9d %10d %10d\n", n, s.histories.Load(), s.ops.Load(),
			s.contended.Load(), s.lapsed.Load(), s.completed.Load(), s.takeovers.Load(), s.claims.Load(), s.fenced.Load(),
			s.unknown.Load(), s.faults.Load(), s.restarts.Load(), s.undecided.Load(), s.anomalies.Load())
	}
	fmt.Println("linearizability: contended: calls that met a record in progress or uncertain in porcupine's linearization (lapsed: a lapsed lease; completed: a completed record);" +
		" takeovers: acquires of a lapsed lease reporting its holder; claims: recoverers' claims of a lapsed record; fenced: calls refused to a token its client acquired the key with")
	faultsMu.Lock()
	defer faultsMu.Unlock()
	kinds := make([]string, 0, len(faultSeen))
	for k := range faultSeen {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, faultSeen[k]))
	}
	fmt.Println("linearizability: faults injected:", strings.Join(parts, ", "))
}

func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Fatalf(format+" (make test starts every server these tests need)", args...)
}

// ---- faults ----

// fault is one toxic: kind, stream (upstream: requests to the store;
// downstream: its replies) and attributes.
type fault struct {
	name, kind, stream string
	attrs              map[string]any
}

var faults = []fault{
	{"latency-in", "latency", "upstream", map[string]any{"latency": 150, "jitter": 100}},
	{"latency-out", "latency", "downstream", map[string]any{"latency": 150, "jitter": 100}},
	// requests held until the toxic goes: the call times out, the store acts later
	{"timeout-in", "timeout", "upstream", map[string]any{"timeout": 0}},
	// replies held: the store acted, the caller times out
	{"timeout-out", "timeout", "downstream", map[string]any{"timeout": 0}},
	{"reset-in", "reset_peer", "upstream", map[string]any{"timeout": 0}},
	{"reset-out", "reset_peer", "downstream", map[string]any{"timeout": 0}},
	{"bandwidth-out", "bandwidth", "downstream", map[string]any{"rate": 1}},
}

var (
	toxiOnce sync.Once
	toxiSrv  *toxiproxy.ApiServer
)

// proxy is an in-process toxiproxy proxy (the library, no API server) in
// front of upstream (host:port), stopped at the end of the test.
func newProxy(t *testing.T, upstream string) *toxiproxy.Proxy {
	t.Helper()
	toxiOnce.Do(func() { toxiSrv = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()) })
	p := toxiproxy.NewProxy(toxiSrv, "linear-"+rand.Text()[:8], "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// nemesis injects the faults in a random order, each for 150–450 ms
// with 150 ms without any between them, until stop; restart (when not
// nil) comes between any two.
func nemesis(t *testing.T, p *toxiproxy.Proxy, seed uint64, restart func() error, counts *stats, stop <-chan struct{}) {
	rng := mrand.New(mrand.NewPCG(seed, 99))
	order := rng.Perm(len(faults))
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-time.After(150 * time.Millisecond):
		}
		k := order[i%len(order)]
		if restart != nil && i%2 == 1 {
			k = len(faults)
		}
		on := time.Duration(150+rng.IntN(300)) * time.Millisecond
		if k == len(faults) {
			counts.restarts.Add(1)
			counted("restart")
			if err := restart(); err != nil {
				t.Errorf("restart: %v", err)
				return
			}
			continue
		}
		f := faults[k]
		name := fmt.Sprintf("%s-%d", f.name, i)
		b, _ := json.Marshal(map[string]any{"name": name, "type": f.kind, "stream": f.stream, "toxicity": 1.0, "attributes": f.attrs})
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(string(b))); err != nil {
			t.Errorf("add toxic %s: %v", f.name, err)
			return
		}
		counts.faults.Add(1)
		counted(f.name)
		select {
		case <-stop:
		case <-time.After(on):
		}
		if err := p.Toxics.RemoveToxic(context.Background(), name); err != nil {
			t.Errorf("remove toxic %s: %v", f.name, err)
			return
		}
	}
}

func counted(kind string) {
	faultsMu.Lock()
	faultSeen[kind]++
	faultsMu.Unlock()
}

// ---- the run ----

// subject is one store under test behind its proxy.
type subject struct {
	name    string
	mode    reacquire
	retries bool // the client sends commands again after a lost reply (see model)
	claims  bool // a takeover in flight is visible to Acquire before Get (see model)
	stale   bool // a takeover may report an earlier holder (see model)
	store   idem.Store
	proxy   *toxiproxy.Proxy
	restart func() error // nil: the server is shared, never restarted
}

// drive records histories of 4 clients on 2 key slots of s under faults
// for duration, and checks each.
func drive(t *testing.T, s subject) {
	counts := statsFor(s.name)
	end := time.Now().Add(*duration)
	for h := 0; time.Now().Before(end); h++ {
		seed := *seedFlag*1000 + uint64(h)
		r := newRecorder(2)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { nemesis(t, s.proxy, seed, s.restart, counts, stop) })
		for c := range 4 {
			wg.Go(func() { client(s.store, r, c, seed, stop, 300*time.Millisecond, counts) })
		}
		time.Sleep(*histDur)
		close(stop)
		wg.Wait()
		s.proxy.Toxics.ResetToxics(context.Background())
		check(t, recorded{Store: s.name, Mode: s.mode, Retries: s.retries, Claims: s.claims, Stale: s.stale, Seed: seed, Ops: r.history()}, counts)
	}
}

func TestLinearizable(t *testing.T) {
	for _, c := range []struct {
		name string
		open func(t *testing.T) subject
	}{
		{"redis", openRedis},
		{"redis-restarts", openOwnRedis},
		{"mongodb", openMongo},
		{"postgres", openPostgres},
		{"mysql", openMySQL},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := c.open(t)
			s.name = c.name
			drive(t, s)
		})
	}
}

// hostPort is the host:port of a URL's authority.
func hostPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	return u.Host
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func redisSubject(t *testing.T, upstream string) subject {
	p := newProxy(t, upstream)
	c := redis.NewClient(&redis.Options{Addr: p.Listen, ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, PoolSize: 8})
	t.Cleanup(func() { _ = c.Close() })
	prefix := "idemlinear:" + rand.Text()[:10] + ":"
	t.Cleanup(func() {
		d := redis.NewClient(&redis.Options{Addr: upstream})
		defer d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		iter := d.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			d.Unlink(ctx, iter.Val())
		}
	})
	return subject{mode: reacquireSame, retries: true, store: redisstore.New(c, redisstore.WithPrefix(prefix)), proxy: p}
}

func openRedis(t *testing.T) subject {
	u := env("IDEM_REDIS_URL", "redis://127.0.0.1:6379/0")
	upstream := hostPort(t, u)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	d := redis.NewClient(&redis.Options{Addr: upstream})
	defer d.Close()
	if err := d.Ping(ctx).Err(); err != nil {
		unavailable(t, "Redis unreachable at %s: %v", upstream, err)
	}
	return redisSubject(t, upstream)
}

// openOwnRedis starts a redis-server on its own port, appending every
// write to its AOF with fsync (appendfsync always), so that a SIGKILL
// loses nothing acknowledged; the restart fault kills and starts it.
func openOwnRedis(t *testing.T) subject {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "no redis-server on PATH")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	ln.Close()
	dir := t.TempDir()
	var mu sync.Mutex
	var cmd *exec.Cmd
	start := func() error {
		c := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--dir", dir, "--appendonly", "yes",
			"--appendfsync", "always", "--save", "", "--daemonize", "no")
		if err := c.Start(); err != nil {
			return err
		}
		mu.Lock()
		cmd = c
		mu.Unlock()
		d := redis.NewClient(&redis.Options{Addr: addr})
		defer d.Close()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if d.Ping(context.Background()).Err() == nil {
				return nil
			}
		}
		return fmt.Errorf("redis-server on %s did not answer", addr)
	}
	kill := func() {
		mu.Lock()
		defer mu.Unlock()
		if cmd != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			cmd = nil
		}
	}
	if err := start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kill)
	s := redisSubject(t, addr)
	s.restart = func() error {
		kill()
		time.Sleep(100 * time.Millisecond)
		return start()
	}
	return s
}

func openMongo(t *testing.T) subject {
	u := os.Getenv("IDEM_MONGO_URI")
	if u == "" {
		unavailable(t, "IDEM_MONGO_URI is not set (scripts/services.sh starts FerretDB)")
	}
	upstream := hostPort(t, u)
	p := newProxy(t, upstream)
	c, err := mongo.Connect(options.Client().ApplyURI(strings.Replace(u, upstream, p.Listen, 1)).
		SetServerSelectionTimeout(2 * time.Second).SetConnectTimeout(time.Second).SetMaxPoolSize(8))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Disconnect(ctx)
	})
	// the collection is dropped through a connection that is not faulted
	direct, err := mongo.Connect(options.Client().ApplyURI(u))
	if err != nil {
		t.Fatal(err)
	}
	name := "l_" + rand.Text()[:12]
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = direct.Database("idem_linear_test").Collection(name).Drop(ctx)
		_ = direct.Disconnect(ctx)
	})
	// its clock offset measured once: the store's clock is the local one
	// shifted by a constant, so that a lapse call's wait holds (history_test.go)
	s := mongostore.New(c.Database("idem_linear_test").Collection(name), mongostore.WithClockRefresh(time.Hour))
	t.Cleanup(func() { _ = s.Close() })
	return subject{mode: reacquireNone, claims: true, store: s, proxy: p}
}

func openPostgres(t *testing.T) subject {
	u := env("IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
	upstream := hostPort(t, u)
	direct, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := direct.Ping(ctx); err != nil {
		unavailable(t, "PostgreSQL unreachable at %s: %v", upstream, err)
	}
	table := "idem_linear_" + strings.ToLower(rand.Text()[:12])
	if err := pgstore.New(direct, pgstore.WithTable(table)).EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = direct.Exec(ctx, "DROP TABLE IF EXISTS "+table)
	})
	p := newProxy(t, upstream)
	cfg, err := pgxpool.ParseConfig(strings.Replace(u, upstream, p.Listen, 1))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := pgstore.New(pool, pgstore.WithTable(table))
	t.Cleanup(func() { _ = s.Close() })
	return subject{mode: reacquireReplace, stale: true, store: s, proxy: p}
}

func openMySQL(t *testing.T) subject {
	cfg, err := mysql.ParseDSN(env("IDEM_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test"))
	if err != nil {
		t.Fatal(err)
	}
	direct := openDB(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := direct.PingContext(ctx); err != nil {
		unavailable(t, "MySQL unreachable at %s: %v", cfg.Addr, err)
	}
	table := "idem_linear_" + strings.ToLower(rand.Text()[:12])
	if err := mysqlstore.New(direct, mysqlstore.WithTable(table)).EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, q := range []string{"DROP TABLE IF EXISTS `" + table + "`", "DROP PROCEDURE IF EXISTS `" + table + mysqlstore.ProcSuffix + "`"} {
			_, _ = direct.ExecContext(ctx, q)
		}
	})
	p := newProxy(t, cfg.Addr)
	faulted := cfg.Clone()
	faulted.Addr = p.Listen
	faulted.Timeout, faulted.ReadTimeout, faulted.WriteTimeout = time.Second, 2*time.Second, 2*time.Second
	s := mysqlstore.New(openDB(t, faulted), mysqlstore.WithTable(table))
	t.Cleanup(func() { _ = s.Close() })
	return subject{mode: reacquireReplace, store: s, proxy: p}
}

func openDB(t *testing.T, cfg *mysql.Config) *sql.DB {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// TestReplay replays every saved history of testdata/histories: porcupine
// still gives it its saved verdict (the model did not drift), and its
// calls, issued again one at a time in invocation order on a fresh record
// of the same store, without faults, form a linearizable history.
func TestReplay(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "histories", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no saved histories in testdata/histories")
	}
	open := map[string]func(t *testing.T) subject{
		"redis": openRedis, "redis-restarts": openRedis, "mongodb": openMongo, "postgres": openPostgres, "mysql": openMySQL,
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var h recorded
			if err := json.Unmarshal(b, &h); err != nil {
				t.Fatal(err)
			}
			if got := porcupine.CheckOperationsTimeout(model(h.Mode, h.Retries, h.Claims, h.Stale), operations(h.Ops), time.Minute); string(got) != h.Verdict {
				t.Errorf("saved history judged %s, saved verdict %s", got, h.Verdict)
			}
			s := open[h.Store](t)
			ops := append([]op(nil), h.Ops...)
			sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
			r := newRecorder(6)
			for _, o := range ops {
				r.call(s.store, o.Client, o.In, 10*time.Second)
			}
			replayed := r.history()
			for _, o := range replayed {
				if o.Out.Result == "unknown" {
					t.Fatalf("replay without faults: %s failed: %s", o.In.Op, o.Out.Err)
				}
			}
			if res := porcupine.CheckOperationsTimeout(model(h.Mode, s.retries, s.claims, s.stale), operations(replayed), time.Minute); res != porcupine.Ok {
				t.Errorf("replayed history of %d calls judged %s", len(replayed), res)
			}
		})
	}
}

// TestCheckerCatches makes sure the checker is not vacuous: a history
// recorded on memstore (4 clients, no faults) is linearizable, and the
// same history with one answer about a completed record changed (another
// response, or the record absent) is not.
func TestCheckerCatches(t *testing.T) {
	completedRead := func(o op) bool {
		return (o.Out.Result == "found" || o.Out.Result == "held") && o.Out.Rec.State == idem.StateCompleted
	}
	// Rounds of 100ms of traffic on a fresh store until a round's history
	// holds a read or acquire of a completed record: which calls a round
	// makes depends on the scheduler, and a round whose keys all went
	// uncertain early (kept for an hour) completes none.
	var ops []op
	for round := 0; round < 100 && !slices.ContainsFunc(ops, completedRead); round++ {
		r := newRecorder(3)
		s := memstore.New()
		counts := &stats{}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for c := range 4 {
			wg.Go(func() { client(s, r, c, 7+uint64(round), stop, 10*time.Second, counts) })
		}
		time.Sleep(100 * time.Millisecond)
		close(stop)
		wg.Wait()
		_ = s.Close()
		ops = r.history()
	}
	m := model(reacquireNone, false, false, false)
	if res := porcupine.CheckOperationsTimeout(m, operations(ops), time.Minute); res != porcupine.Ok {
		t.Fatalf("memstore history of %d calls judged %s", len(ops), res)
	}
	i := slices.IndexFunc(ops, completedRead)
	if i < 0 {
		t.Fatalf("no read or acquire of a completed record in 100 rounds (the last: %d calls)", len(ops))
	}
	for _, change := range []func(*output){
		func(o *output) { o.Rec.Resp += "-changed" },
		func(o *output) { *o = output{Result: "notfound"} },
	} {
		bad := slices.Clone(ops)
		change(&bad[i].Out)
		if res := porcupine.CheckOperationsTimeout(m, operations(bad), time.Minute); res != porcupine.Illegal {
			t.Errorf("history with %s answered %+v judged %s, want Illegal", bad[i].In.Op, bad[i].Out, res)
		}
	}
}
