package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"flag"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/payments"
	"github.com/idemkit/idem/examples/internal/procs"
	"github.com/idemkit/idem/tools/history"
)

var (
	soakTraffic = flag.Duration("soak-traffic", 8*time.Second, "TestRecoverySoak: how long each store takes payments")
	soakRate    = flag.Int("soak-rate", 50, "TestRecoverySoak: payments sent per second, each a fresh key of the recoverable route")
	soakKill    = flag.Duration("soak-kill-every", 3*time.Second, "TestRecoverySoak: how often an instance is SIGKILLed mid-handler and restarted")
	soakHistory = flag.String("soak-history", "redis=1000",
		"TestRecoverySoak: completed recoverable records written to each store before its traffic (store=n,...; a store not named is not run)")
	soakOut = flag.String("soak-out", "", "TestRecoverySoak: write each store's figures to this file as benchmark lines (benchmarks/cmd/report reads benchmarks/results/recovery-soak.txt)")
)

// Each store's recoverers in the soak: a short RecoverEvery, a lease long
// enough for a loaded machine's renewals (FerretDB's calls are slower).
const (
	soakEvery = time.Second
	soakLease = 4 * time.Second
)

// soakFlags are the flags of env's instances in the soak: on PostgreSQL
// a pool of 16 connections per instance, as the service's MySQL pool
// (pgxpool's default, 4 on 2 cores, queues 70 payments a second past
// the store timeout).
func soakFlags(env *crashEnv) []string {
	timeout, lease := "1s", soakLease
	if env.cfg.Store == "mongo" {
		timeout, lease = "2s", 2*soakLease
	}
	flags := []string{"-recover", "-recover-every", soakEvery.String(), "-lease", lease.String(), "-store-timeout", timeout}
	if env.cfg.Store == "postgres" {
		sep := "?"
		if strings.Contains(env.cfg.PostgresURL, "?") {
			sep = "&"
		}
		flags = append(flags, "-postgres-url", env.cfg.PostgresURL+sep+"pool_max_conns=16")
	}
	return flags
}

// seedHistory writes n completed recoverable records to st before the
// soak's traffic (tools/history: one through the Store API, the others
// copied by the store's server with clone): the one place the soak seeds
// its history.
func seedHistory(ctx context.Context, st idem.Store, clone history.Cloner, n int) error {
	_, err := history.Seed(ctx, st, clone, n)
	return err
}

// TestRecoverySoak runs recovery behind a history on the
// shared stores named by -soak-history in turn (make test: Redis behind
// 1,000 records, 50 payments/s for 8 s; make soak: Redis, PostgreSQL and
// MySQL behind 1,000,000 records, 200 payments/s for minutes): three
// instances with recoverers
// (RecoverEvery 1s) take -soak-rate fresh payments a second for
// -soak-traffic, no client ever retries, and every -soak-kill-every one
// of the three is SIGKILLed under its traffic and restarted, while a
// fourth instance (its recoverer idle) holds a payment at each pause point and
// is SIGKILLed there. Once the traffic ends it waits until no payment is
// in progress and checks what only a fault breaks: every payment answered
// 201 completed; every completed payment one ledger row (SQL stores), the
// others none; the provider saw no two runs of a key at once, a charge
// per completed or parked payment and a receipt per completed one; and
// the recovery index (Redis: its sorted set; SQL: rows with due_at; MongoDB
// wire: documents with dueAt) empty once nothing is in flight, whatever the
// history. It reports, without asserting them (the machine is shared),
// the time from each lease's lapse to its recovery claim by the store's
// clock (from the instances' takeover log lines: the records of killed
// holders, and those whose handler answered 5xx after a journaled step,
// whose lease lapses at once) against 2 × RecoverEvery
// (a crashed record claimed within lease + 2 × RecoverEvery of its last
// renewal), the index size over time and Redis's memory, and writes them
// to -soak-out.
func TestRecoverySoak(t *testing.T) {
	sizes, err := parseSoakHistory(*soakHistory)
	if err != nil {
		t.Fatal(err)
	}
	var out *os.File
	if *soakOut != "" {
		if out, err = os.Create(*soakOut); err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		fmt.Fprintf(out, "# TestRecoverySoak, %s: go test -run TestRecoverySoak -soak -soak-traffic %v -soak-rate %d -soak-kill-every %v -soak-history %s (examples/payments), read by benchmarks/cmd/report\n",
			time.Now().UTC().Format("2006-01-02 15:04 MST"), *soakTraffic, *soakRate, *soakKill, *soakHistory)
	}
	bin, provider := buildCrashBinaries(t)
	for _, store := range []string{"redis", "postgres", "mysql", "mongo"} {
		n, ok := sizes[store]
		if !ok {
			continue
		}
		t.Run(store, func(t *testing.T) {
			lines := soakStore(t, newCrashEnv(t, store, bin, provider), n)
			if out != nil {
				for _, l := range lines {
					fmt.Fprintln(out, l)
				}
			}
		})
	}
}

// parseSoakHistory reads -soak-history: store=n,... of redis, postgres,
// mysql and mongo.
func parseSoakHistory(s string) (map[string]int, error) {
	sizes := map[string]int{}
	for f := range strings.SplitSeq(s, ",") {
		store, n, ok := strings.Cut(strings.TrimSpace(f), "=")
		v, err := strconv.Atoi(n)
		if !ok || err != nil || v < 0 || !slices.Contains([]string{"redis", "postgres", "mysql", "mongo"}, store) {
			return nil, fmt.Errorf("-soak-history %q: want store=n,... of redis, postgres, mysql, mongo", s)
		}
		sizes[store] = v
	}
	return sizes, nil
}

// soakPayment is one payment of the soak and what its client saw.
type soakPayment struct {
	user, key string
	amount    int64
	status    atomic.Int64 // its answer's status; 0: cut (no answer)
}

// soakSample is the recovery index's size (and Redis's memory) at one time.
type soakSample struct {
	at                  time.Duration // since the traffic began
	index               int64
	usedMemory, indexMB int64 // Redis: INFO used_memory, MEMORY USAGE of the index (bytes)
}

// soakStore is TestRecoverySoak on env's store with a history of n
// records; it returns the store's result lines.
func soakStore(t *testing.T, env *crashEnv, n int) []string {
	store := env.cfg.Store
	ctx := context.Background()
	probe := newSoakProbe(t, env)
	st, closeStore, err := payments.OpenStore(env.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	began := time.Now()
	if err := seedHistory(ctx, st, probe.clone, n); err != nil {
		t.Fatal(err)
	}
	seeded := time.Since(began)
	t.Logf("%s: %d completed recoverable records written in %v", store, n, seeded.Round(time.Second))
	loadStart := loadAverage()

	flags := soakFlags(env)
	var live [3]atomic.Pointer[procs.Proc]
	for i := range live {
		live[i].Store(env.start(t, flags...))
	}
	before := env.stats(t)
	run := "soak-" + strings.ToLower(rand.Text()[:8])
	var (
		mu   sync.Mutex
		pays []*soakPayment
	)
	newPayment := func() *soakPayment {
		mu.Lock()
		defer mu.Unlock()
		i := len(pays)
		p := &soakPayment{user: fmt.Sprintf("%s-%d", run, i), key: rand.Text(), amount: int64(1000 + i%2000)} // never the declined 4000
		pays = append(pays, p)
		return p
	}

	// The index sampler, every second until the checks end.
	var samples []soakSample
	sampleDone, sampleStop := make(chan struct{}), make(chan struct{})
	trafficStart := time.Now()
	go func() {
		defer close(sampleDone)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			if s, err := probe.sample(ctx); err == nil {
				s.at = time.Since(trafficStart)
				samples = append(samples, s)
			}
			select {
			case <-sampleStop:
				return
			case <-tick.C:
			}
		}
	}()

	// The traffic: soakRate payments a second across the live instances,
	// paced by the clock (each tick sends what the rate owes by then, so a
	// late tick on a loaded machine does not lower the rate), at most 2,000
	// unanswered at once (a payment owed then is skipped and counted).
	var sends sync.WaitGroup
	stop := make(chan struct{})
	var skipped atomic.Int64
	sem := make(chan struct{}, 2000)
	trafficDone := make(chan struct{})
	go func() {
		defer close(trafficDone)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for owed := int(time.Since(trafficStart).Seconds() * float64(*soakRate)); i < owed; i++ {
				var inst *procs.Proc
				for j := range live {
					if inst = live[(i+j)%len(live)].Load(); inst != nil {
						break
					}
				}
				select {
				case sem <- struct{}{}:
				default:
					skipped.Add(1)
					continue
				}
				p := newPayment()
				sends.Go(func() {
					defer func() { <-sem }()
					status, _, _ := send(inst.URL, p.user, p.key, p.amount)
					p.status.Store(int64(status))
				})
			}
		}
	}()

	// The crashes: every soakKill, a payment held at each pause point of an
	// instance without a recoverer, SIGKILLed there; and one of the three
	// SIGKILLed under its traffic and restarted.
	kills, held := 0, 0
	killsDone := make(chan struct{})
	go func() {
		defer close(killsDone)
		tick := time.NewTicker(*soakKill)
		defer tick.Stop()
		for cycle := 0; ; cycle++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			held += holdAndKill(t, env, newPayment)
			slot := &live[cycle%len(live)]
			old := slot.Load()
			slot.Store(nil) // new payments go to the other two
			old.Kill()
			kills++
			p, err := procs.Start(env.bin, env.logs, append(slices.Clone(env.args), flags...)...)
			if err != nil {
				t.Errorf("restart: %v", err)
				return
			}
			t.Cleanup(p.Kill)
			slot.Store(p)
		}
	}()
	time.Sleep(*soakTraffic)
	close(stop)
	<-trafficDone
	<-killsDone
	sends.Wait()
	traffic := time.Since(trafficStart)
	sent := len(pays)
	t.Logf("%s: %d payments in %v (%.0f/s; %d ticks skipped at 2,000 unanswered), %d instances SIGKILLed under traffic, %d payments held at pause points and SIGKILLed",
		store, sent, traffic.Round(time.Second), float64(sent)/traffic.Seconds(), skipped.Load(), kills, held)

	// Settle: every payment completed, parked uncertain, or never stored.
	settled := time.Now()
	states := env.soakSettle(t, st.(idem.Inspector), pays, 10*time.Minute)
	t.Logf("%s: every payment settled %v after the traffic", store, time.Since(settled).Round(time.Second))
	time.Sleep(2 * time.Second) // a last sample or two with nothing in flight
	close(sampleStop)
	<-sampleDone
	for i := range live {
		if p := live[i].Load(); p != nil {
			p.Stop()
		}
	}
	loadEnd := loadAverage()

	// The checks that only a fault fails.
	count := map[idem.State]int{}
	var cut, failed int
	for _, p := range pays {
		s := states[p.key]
		count[s]++
		switch code := p.status.Load(); {
		case code == 0:
			cut++
		case code == http.StatusCreated && s != idem.StateCompleted:
			t.Errorf("%s answered 201 but its record is %v", p.user, s)
		case code >= 500:
			failed++
		}
	}
	completed, uncertain := int64(count[idem.StateCompleted]), int64(count[idem.StateUncertain])
	if probe.ledger != nil {
		rows := probe.ledger(t, run+"-")
		for _, p := range pays {
			want := int64(0)
			if states[p.key] == idem.StateCompleted {
				want = 1
			}
			if rows[p.user] != want {
				t.Errorf("%s (%v, answered %d): %d ledger rows, want %d", p.user, states[p.key], p.status.Load(), rows[p.user], want)
			}
		}
	}
	after := env.stats(t)
	if got := after.Conflicts - before.Conflicts; got != 0 {
		t.Errorf("provider: %d charge calls came while another under the key ran: a record ran twice at once", got)
	}
	// A payment answered 5xx may have charged (and mailed) before its
	// journal write failed, its record released: slack for those only.
	if got := after.Charges - before.Charges; got < completed+uncertain || got > completed+uncertain+int64(failed) {
		t.Errorf("provider: %d charges for %d completed and %d parked payments (%d answered 5xx), want one each", got, completed, uncertain, failed)
	}
	if got := after.Emails - before.Emails; got < completed || got > completed+uncertain+int64(failed) {
		t.Errorf("provider: %d receipts for %d completed and %d parked payments (%d answered 5xx), want one per completed one", got, completed, uncertain, failed)
	}
	if len(samples) == 0 {
		t.Fatal("no index sample")
	}
	if last := samples[len(samples)-1]; last.index != 0 {
		t.Errorf("the recovery index holds %d entries with no payment in flight, want 0 (it holds completed records)", last.index)
	}
	t.Logf("%s: %d payments: %d completed, %d parked uncertain, %d never stored; %d cut by a SIGKILL, %d answered 5xx",
		store, sent, completed, uncertain, count[0], cut, failed)

	// The figures.
	lapsed := lapsedClaims(t, env.logs.Name(), trafficStart)
	lease := soakLease
	if store == "mongo" {
		lease *= 2
	}
	lines := soakLines(t, store, n, seeded, traffic, sent, kills, held, lease, lapsed, samples, loadStart, loadEnd)
	lines[0] += fmt.Sprintf(" %d completed %d parked %d answered-5xx %d cut", completed, uncertain, failed, cut)
	return lines
}

// holdAndKill starts an instance that holds each payment at a pause
// point (-recover for its route's recovery payloads, its own recoverer's
// first pass an hour away), sends it one payment per point, SIGKILLs it
// once all are held (or 60s passed), and returns how many were held.
func holdAndKill(t *testing.T, env *crashEnv, newPayment func() *soakPayment) int {
	flags := append(soakFlags(env), "-recover-every", "1h")
	p, err := procs.Start(env.bin, env.logs, append(slices.Clone(env.args), append(flags, "-pause-at", strings.Join(payments.PausePoints, ","))...)...)
	if err != nil {
		t.Errorf("the held instance: %v", err)
		return 0
	}
	defer p.Kill()
	var wg sync.WaitGroup
	defer wg.Wait()
	for range payments.PausePoints {
		pay := newPayment()
		wg.Go(func() {
			status, _, _ := send(p.URL, pay.user, pay.key, pay.amount)
			pay.status.Store(int64(status))
		})
	}
	n := 0
	for n < len(payments.PausePoints) {
		if _, err := p.Line("paused at "); err != nil {
			break
		}
		n++
	}
	p.Kill()
	return n
}

// soakSettle polls the records of pays (16 at once) until none is in
// progress, for at most limit, and returns each one's state by key (0:
// no record: the payment never reached the store). Every 30s, and when
// it fails, it logs what the store holds for a payment still pending.
func (env *crashEnv) soakSettle(t *testing.T, in idem.Inspector, pays []*soakPayment, limit time.Duration) map[string]idem.State {
	t.Helper()
	states := map[string]idem.State{}
	var mu sync.Mutex
	pending := pays
	began, logged := time.Now(), time.Now()
	for deadline := began.Add(limit); ; {
		var next []*soakPayment
		work := make(chan *soakPayment)
		var wg sync.WaitGroup
		var ierr atomic.Pointer[error]
		for range 16 {
			wg.Go(func() {
				for p := range work {
					c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					info, found, err := in.Inspect(c, idem.ScopedKey(p.user, "POST", "/v1/payments", p.key))
					cancel()
					mu.Lock()
					switch {
					case err != nil:
						ierr.Store(&err)
						next = append(next, p)
					case !found:
						states[p.key] = 0
					default:
						states[p.key] = info.State
						if info.State == idem.StateInProgress {
							next = append(next, p)
						}
					}
					mu.Unlock()
				}
			})
		}
		for _, p := range pending {
			work <- p
		}
		close(work)
		wg.Wait()
		if len(next) == 0 {
			return states
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, p := range next[:min(len(next), 5)] {
				key := idem.ScopedKey(p.user, "POST", "/v1/payments", p.key)
				fmt.Fprintf(&b, "\n%s (answered %d), key %.16s: %s", p.user, p.status.Load(), key, env.describeRecord(t, in, key))
			}
			var last error
			if e := ierr.Load(); e != nil {
				last = *e
			}
			t.Fatalf("%d of %d payments still in progress %v after the traffic (last error %v):%s", len(next), len(pays), limit, last, b.String())
		}
		if time.Since(logged) > 30*time.Second {
			logged = time.Now()
			key := idem.ScopedKey(next[0].user, "POST", "/v1/payments", next[0].key)
			t.Logf("%d payments in progress %v after the traffic, e.g. %s (answered %d): %s", len(next), time.Since(began).Round(time.Second), next[0].user, next[0].status.Load(), env.describeRecord(t, in, key))
		}
		pending = next
		time.Sleep(time.Second)
	}
}

// soakProbe reads a store's recovery index size and its ledger, and
// copies its history.
type soakProbe struct {
	// clone copies a completed record in the store's server (tools/history).
	clone  history.Cloner
	sample func(ctx context.Context) (soakSample, error)
	// ledger returns the ledger rows per user of the users with prefix
	// (SQL stores), nil for the others.
	ledger func(t *testing.T, prefix string) map[string]int64
}

// newSoakProbe opens env's store as a client of its own: Redis's index is
// the sorted set prefix+"recovery" (stores/redisstore/index.go); the SQL
// stores' is the due_at index over idem_records (rows due or in
// progress with a recovery payload: due_at set); the MongoDB wire's the
// dueAt index (documents with dueAt).
func newSoakProbe(t *testing.T, env *crashEnv) *soakProbe {
	t.Helper()
	ctx := context.Background()
	pr := &soakProbe{}
	switch env.cfg.Store {
	case "redis":
		opts, err := redis.ParseURL(env.cfg.RedisURL)
		if err != nil {
			t.Fatal(err)
		}
		rc := redis.NewClient(opts)
		t.Cleanup(func() { _ = rc.Close() })
		key := env.cfg.RedisPrefix + "recovery"
		pr.clone = history.Redis(rc, env.cfg.RedisPrefix)
		used := regexp.MustCompile(`(?m)^used_memory:(\d+)`)
		pr.sample = func(ctx context.Context) (s soakSample, err error) {
			if s.index, err = rc.ZCard(ctx, key).Result(); err != nil {
				return s, err
			}
			s.indexMB, _ = rc.MemoryUsage(ctx, key).Result() // absent (0) when empty
			info, err := rc.Info(ctx, "memory").Result()
			if m := used.FindStringSubmatch(info); err == nil && m != nil {
				s.usedMemory, _ = strconv.ParseInt(m[1], 10, 64)
			}
			return s, err
		}
	case "postgres":
		pool, err := pgxpool.New(ctx, env.cfg.PostgresURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		records := pgx.Identifier{env.cfg.PostgresSchema, "idem_records"}.Sanitize()
		ledger := pgx.Identifier{env.cfg.PostgresSchema, "payments"}.Sanitize()
		pr.clone = history.Postgres(pool, env.cfg.PostgresSchema+".idem_records")
		pr.sample = func(ctx context.Context) (s soakSample, err error) {
			err = pool.QueryRow(ctx, "SELECT count(*) FROM "+records+" WHERE due_at IS NOT NULL").Scan(&s.index)
			return s, err
		}
		pr.ledger = func(t *testing.T, prefix string) map[string]int64 {
			rows, err := pool.Query(ctx, "SELECT user_id, count(*) FROM "+ledger+" WHERE user_id LIKE $1 GROUP BY user_id", prefix+"%")
			if err != nil {
				t.Fatal(err)
			}
			return collectRows(t, rows.Scan, rows.Next, rows.Err)
		}
	case "mysql":
		db, err := sql.Open("mysql", env.cfg.MySQLDSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		pr.clone = history.MySQL(db, "")
		pr.sample = func(ctx context.Context) (s soakSample, err error) {
			err = db.QueryRowContext(ctx, "SELECT count(*) FROM idem_records WHERE due_at IS NOT NULL").Scan(&s.index)
			return s, err
		}
		pr.ledger = func(t *testing.T, prefix string) map[string]int64 {
			rows, err := db.QueryContext(ctx, "SELECT user_id, count(*) FROM payments WHERE user_id LIKE ? GROUP BY user_id", prefix+"%")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			return collectRows(t, rows.Scan, rows.Next, rows.Err)
		}
	case "mongo":
		client, err := mongo.Connect(options.Client().ApplyURI(env.cfg.MongoURI))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.Disconnect(ctx) })
		coll := client.Database(env.cfg.MongoDB).Collection("idempotency")
		pr.clone = history.Mongo(coll)
		pr.sample = func(ctx context.Context) (s soakSample, err error) {
			s.index, err = coll.CountDocuments(ctx, bson.D{{Key: "dueAt", Value: bson.D{{Key: "$exists", Value: true}}}})
			return s, err
		}
	}
	return pr
}

// collectRows reads (user, count) rows into a map.
func collectRows(t *testing.T, scan func(dst ...any) error, next func() bool, errf func() error) map[string]int64 {
	t.Helper()
	m := map[string]int64{}
	for next() {
		var user string
		var n int64
		if err := scan(&user, &n); err != nil {
			t.Fatal(err)
		}
		m[user] = n
	}
	if err := errf(); err != nil {
		t.Fatal(err)
	}
	return m
}

// takeoverLine is an engine's log line of a takeover (core's
// reportTakeover, through the default slog handler: "2006/01/02
// 15:04:05 WARN ..."): lapsed is how long the lease had lapsed by the
// store's clock when the record was taken over. In the soak no client
// retries, so every takeover is a recoverer's claim.
var takeoverLine = regexp.MustCompile(`^(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d) .*took over a lapsed lease.* lapsed=(\S+)`)

// soakClaim is one recovery claim: when (since the traffic began, to the
// second of its log line) and how long the lease had lapsed.
type soakClaim struct{ at, lapsed time.Duration }

// lapsedClaims reads the recovery claims logged to the file at path.
func lapsedClaims(t *testing.T, path string, start time.Time) []soakClaim {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cs []soakClaim
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := takeoverLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, err1 := time.ParseInLocation("2006/01/02 15:04:05", m[1], time.Local)
		d, err2 := time.ParseDuration(m[2])
		if err1 == nil && err2 == nil {
			cs = append(cs, soakClaim{at.Sub(start.Truncate(time.Second)), d})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return cs
}

// lapses returns the lapse→claim durations of the claims logged in
// (from, to] since the traffic began, sorted.
func lapses(cs []soakClaim, from, to time.Duration) []time.Duration {
	var ds []time.Duration
	for _, c := range cs {
		if c.at > from && c.at <= to {
			ds = append(ds, c.lapsed)
		}
	}
	slices.Sort(ds)
	return ds
}

// quantile is the q-quantile of sorted ds (nearest rank), 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(q*float64(len(ds))+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// loadAverage is /proc/loadavg's 1-minute load average, 0 where there is none.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// soakLines logs a store's figures and returns them as benchmark lines:
// BenchmarkRecoverySoak/store=S with the run's figures, and
// BenchmarkRecoverySoak/store=S/at=Ns every 15 seconds with the index
// (and Redis's memory) then, and the claims logged since the line before
// with their p99 lapse→claim.
func soakLines(t *testing.T, store string, history int, seeded, traffic time.Duration, sent, kills, held int, lease time.Duration,
	claims []soakClaim, samples []soakSample, loadStart, loadEnd float64,
) []string {
	t.Helper()
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	lapsed := lapses(claims, -time.Hour, time.Hour)
	p50, p99, worst := quantile(lapsed, 0.5), quantile(lapsed, 0.99), quantile(lapsed, 1)
	lo, hi := samples[0].index, samples[0].index
	for _, s := range samples {
		lo, hi = min(lo, s.index), max(hi, s.index)
	}
	first, last := samples[0], samples[len(samples)-1]
	t.Logf("%s: %d recovery claims, lapse→claim p50 %v, p99 %v, max %v (2 × RecoverEvery %v; lease %v); index min %d, max %d, last %d (history %d); Redis used_memory %d → %d B",
		store, len(lapsed), p50, p99, worst, 2*soakEvery, lease, lo, hi, last.index, history, first.usedMemory, last.usedMemory)
	name := "BenchmarkRecoverySoak/store=" + store
	lines := []string{fmt.Sprintf("%s 1 %d ns/op %d history %.0f seed-s %.1f req/s %d payments %d kills %d held %d claims %.1f p50-ms %.1f p99-ms %.1f max-ms %.0f lease-ms %.0f every-ms %d index-min %d index-max %d index-last %d mem-start-B %d mem-end-B %.1f load-start %.1f load-end",
		name, traffic.Nanoseconds(), history, seeded.Seconds(), float64(sent)/traffic.Seconds(), sent, kills, held, len(lapsed),
		ms(p50), ms(p99), ms(worst), ms(lease), ms(soakEvery), lo, hi, last.index, first.usedMemory, last.usedMemory, loadStart, loadEnd)}
	next, prev := time.Duration(0), -time.Hour
	for _, s := range samples {
		if s.at >= next || s == last {
			at := s.at.Truncate(time.Second)
			window := lapses(claims, prev, at)
			prev = at
			lines = append(lines, fmt.Sprintf("%s/at=%ds 1 0 ns/op %d index %d used-memory-B %d index-B %d claims %.1f p99-ms",
				name, int(at.Seconds()), s.index, s.usedMemory, s.indexMB, len(window), ms(quantile(window, 0.99))))
			next = s.at.Truncate(15*time.Second) + 15*time.Second
		}
	}
	return lines
}
