// Command demo shows idem keeping payments exactly-once under the things
// real clients do: double clicks, timeouts and retries, provider failures,
// reused keys. It builds the payments service (examples/payments), starts it
// on each framework on a free loopback port as its own process, plays the scenarios, and prints a table
// per framework with the idem decisions the service counted on its /metrics,
// and nothing else: the services' logs go to a file that is shown only on
// failure. With -store redis its keys live under their own prefix
// (-redis-prefix, default "idem-demo:"), deleted when it is done; with -store postgres its tables
// live in their own schema (-postgres-schema, default idem_demo), and with
// -store mysql in their own database (-mysql-dsn, default database
// idem_demo, created if missing); with either, every payment is a row
// written through its execution's transaction. It exits 1
// if any logical payment was charged successfully more than once.
//
//	go run ./examples/demo                       # every framework, memory store
//	go run ./examples/demo -framework gin -store redis
//	go run ./examples/demo -store postgres       # PostgreSQL at -postgres-url
//	go run ./examples/demo -store mysql          # MySQL or MariaDB at -mysql-dsn
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/client/idemclient"
	"github.com/idemkit/idem/examples/internal/procs"
	"github.com/redis/go-redis/v9"
)

func main() {
	framework := flag.String("framework", "all", strings.Join(procs.Frameworks, ", ")+" or all")
	store := flag.String("store", "memory", "memory, redis, mongo, postgres or mysql")
	redisURL := flag.String("redis-url", "redis://127.0.0.1:6379/0", "Redis URL for -store redis")
	redisPrefix := flag.String("redis-prefix", "idem-demo:", "prefix of the demo's Redis keys, apart from any service's")
	mongoURI := flag.String("mongo-uri", "mongodb://127.0.0.1:27017/", "MongoDB URI for -store mongo")
	pgURL := flag.String("postgres-url", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL for -store postgres")
	pgSchema := flag.String("postgres-schema", "idem_demo", "schema of the demo's PostgreSQL tables, apart from any service's")
	mysqlDSN := flag.String("mysql-dsn", "root@tcp(127.0.0.1:3306)/idem_demo", "MySQL/MariaDB DSN for -store mysql; its database (created if missing) is the demo's, apart from any service's")
	latency := flag.Duration("charge-latency", 300*time.Millisecond, "simulated provider latency")
	flag.Parse()

	names := procs.Frameworks
	if *framework != "all" {
		if !slices.Contains(procs.Frameworks, *framework) {
			fmt.Fprintf(os.Stderr, "-framework %q: want one of %v or all\n", *framework, procs.Frameworks)
			os.Exit(2)
		}
		names = []string{*framework}
	}
	dir, err := os.MkdirTemp("", "idem-demo-")
	if err != nil {
		fail(err, "")
	}
	defer os.RemoveAll(dir)

	bin, err := procs.Build(context.Background(), dir)
	if err != nil {
		fail(err, "")
	}
	ok := true
	for _, name := range names {
		// The services' own logs (the recovery middleware's stack traces for
		// the panic scenario, among others) go to a file, shown on failure.
		logPath := filepath.Join(dir, name+".log")
		logs, err := os.Create(logPath)
		if err != nil {
			fail(err, "")
		}
		p, err := procs.Start(bin, logs, "-framework", name, "-store", *store, "-redis-url", *redisURL, "-redis-prefix", *redisPrefix,
			"-mongo-uri", *mongoURI, "-postgres-url", *pgURL, "-postgres-schema", *pgSchema, "-mysql-dsn", *mysqlDSN, "-charge-latency", latency.String())
		if err != nil {
			fail(err, logPath)
		}
		d := &demo{url: p.URL, latency: *latency, client: &http.Client{Timeout: 30 * time.Second}}
		rows := d.run()
		counted, err := procs.Scrape(d.client, p.URL)
		p.Stop()
		logs.Close()
		if d.err != nil {
			fail(d.err, logPath)
		}
		fmt.Printf("%s, %s store, provider latency %v\n", name, *store, *latency)
		if !printTable(rows) {
			ok = false
			showLogs(logPath)
		}
		if err != nil {
			fail(fmt.Errorf("metrics: %w", err), logPath)
		}
		printDecisions(counted)
		fmt.Println()
	}
	if *store == "redis" { // the records would otherwise stay for their retention (24h)
		n, err := deleteRedisKeys(*redisURL, *redisPrefix)
		if err != nil {
			fail(fmt.Errorf("removing the demo's Redis keys: %w", err), "")
		}
		fmt.Printf("removed the demo's %d Redis keys (prefix %q)\n", n, *redisPrefix)
	}
	if !ok {
		fmt.Println("FAIL: a payment was charged more than once")
		os.Exit(1)
	}
	fmt.Println("OK: one charge per logical payment")
}

// fail reports err and the service log at logPath (if any), and exits 1.
func fail(err error, logPath string) {
	fmt.Fprintln(os.Stderr, "demo:", err)
	showLogs(logPath)
	os.Exit(1)
}

// showLogs copies the service log at logPath to stderr.
func showLogs(logPath string) {
	if logPath == "" {
		return
	}
	b, err := os.ReadFile(logPath)
	if err != nil || len(b) == 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "--- service log %s ---\n%s--- end of service log ---\n", filepath.Base(logPath), b)
}

type demo struct {
	url     string
	latency time.Duration
	client  *http.Client
	err     error // the first failure to read the service's stats
}

type row struct {
	scenario string
	sent     int
	statuses map[string]int
	charges  int64 // provider executions
	want     int64 // expected executions
	ids      int   // distinct successful payment ids
	note     string
}

type answer struct {
	status   int
	replayed bool
	id       string
}

func newKey() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (d *demo) pay(client *http.Client, user, key string, amount int) (answer, error) {
	body := fmt.Sprintf(`{"amount":%d,"currency":"eur"}`, amount)
	req, _ := http.NewRequest(http.MethodPost, d.url+"/v1/payments", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", user)
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var p struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(b, &p)
	return answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", id: p.ID}, nil
}

// executions returns the service's provider executions so far; a failure
// to read them is kept in d.err.
func (d *demo) executions() int64 {
	resp, err := d.client.Get(d.url + "/v1/stats")
	if err == nil {
		defer resp.Body.Close()
		var s struct {
			Executions int64 `json:"executions"`
		}
		if err = json.NewDecoder(resp.Body).Decode(&s); err == nil {
			return s.Executions
		}
	}
	if d.err == nil {
		d.err = fmt.Errorf("GET /v1/stats: %w", err)
	}
	return 0
}

// play runs s and counts the answers and the provider executions it caused.
func (d *demo) play(s scenario) row {
	r := row{scenario: s.name, want: s.want, note: s.note, statuses: map[string]int{}}
	var mu sync.Mutex
	ids := map[string]bool{}
	before := d.executions()
	s.play(d, func(c *http.Client, user, key string, amount int) answer {
		a, err := d.pay(c, user, key, amount)
		mu.Lock()
		defer mu.Unlock()
		r.sent++
		label := "timeout"
		if err == nil {
			label = fmt.Sprint(a.status)
			if a.replayed {
				label += " replay"
			}
			if a.status == http.StatusCreated {
				ids[a.id] = true
			}
		}
		r.statuses[label]++
		return a
	})
	r.charges = d.executions() - before
	r.ids = len(ids)
	return r
}

// retry sends until the answer is not 409, as a well-behaved client honouring Retry-After does.
func retry(send sender, c *http.Client, user, key string, amount int) answer {
	for i := 0; ; i++ {
		a := send(c, user, key, amount)
		if a.status != http.StatusConflict || i == 50 {
			return a
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sender sends one payment request and records its answer in the row.
type sender func(c *http.Client, user, key string, amount int) answer

// scenario is one row of the table: what clients do, and how many provider
// executions that should cause.
type scenario struct {
	name string
	want int64
	note string
	play func(d *demo, send sender)
}

var scenarios = []scenario{
	{"50 concurrent double-clicks, one key", 1, "", func(d *demo, send sender) {
		key := newKey()
		var wg sync.WaitGroup
		for range 50 {
			wg.Add(1)
			go func() { defer wg.Done(); send(d.client, "alice", key, 1999) }()
		}
		wg.Wait()
		c := &http.Client{Transport: idemclient.New()} // waits out 409s as Retry-After says
		defer c.CloseIdleConnections()
		send(c, "alice", key, 1999) // the client finally reads its result
	}},
	{"client times out mid-request, idemclient retries", 1, "one call: its attempts share the key", func(d *demo, send sender) {
		// idemclient abandons the attempt after latency/3, re-sends it with
		// the same key, waits out the 409 (Retry-After) and gets the replay.
		c := &http.Client{Transport: idemclient.New(idemclient.WithAttemptTimeout(d.latency/3), idemclient.WithMaxAttempts(20))}
		defer c.CloseIdleConnections()
		send(c, "alice", newKey(), 2500)
	}},
	{"provider 5xx, then retry", 2, "a 5xx is not stored: the retry runs again by design", func(d *demo, send sender) {
		key := newKey()
		send(d.client, "alice", key, 5000)
		retry(send, d.client, "alice", key, 5000)
	}},
	{"card declined (402), then retry", 1, "a 4xx is stored and replayed", func(d *demo, send sender) {
		key := newKey()
		send(d.client, "alice", key, 4000)
		retry(send, d.client, "alice", key, 4000)
	}},
	{"handler panics (500), then retry", 2, "a panic releases the key: the retry runs again", func(d *demo, send sender) {
		key := newKey()
		send(d.client, "alice", key, 6000)
		retry(send, d.client, "alice", key, 6000)
	}},
	{"key reused with another amount", 1, "422, nothing charged twice", func(d *demo, send sender) {
		key := newKey()
		send(d.client, "alice", key, 1000)
		send(d.client, "alice", key, 2000)
		send(d.client, "alice", key, 1000)
	}},
	{"two users, same key", 2, "keys are scoped per user", func(d *demo, send sender) {
		key := newKey()
		send(d.client, "alice", key, 1500)
		send(d.client, "bob", key, 1500)
	}},
}

// run plays every scenario, one after the other.
func (d *demo) run() []row {
	rows := make([]row, 0, len(scenarios))
	for _, s := range scenarios {
		rows = append(rows, d.play(s))
	}
	return rows
}

// ok reports whether the scenario executed what it should and no logical
// payment succeeded under two payment ids.
func (r row) ok() bool {
	maxIDs := 1
	if r.scenario == "two users, same key" {
		maxIDs = 2
	}
	return r.charges == r.want && r.ids <= maxIDs
}

// printDecisions prints the service's idem_decisions_total counters (its
// GET /metrics, filled by idemotel) by outcome, in the engine's order.
func printDecisions(m procs.Metrics) {
	counts := m.Decisions()
	var b strings.Builder
	for _, outcome := range []string{"acquired", "replayed", "conflict", "mismatch", "rejected", "completed", "released", "lease-lost", "store-error"} {
		if n := counts[outcome]; n > 0 {
			fmt.Fprintf(&b, ", %s %v", outcome, n)
		}
	}
	fmt.Printf("idem decisions on /metrics: %s\n", strings.TrimPrefix(b.String(), ", "))
}

// printTable prints rows and reports whether every logical payment was
// charged successfully at most once.
func printTable(rows []row) bool {
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\trequests\tstatus codes seen\tcharges executed\texpected\tresult")
	ok := true
	for _, r := range rows {
		labels := make([]string, 0, len(r.statuses))
		for l := range r.statuses {
			labels = append(labels, l)
		}
		sort.Strings(labels)
		var b bytes.Buffer
		for i, l := range labels {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s ×%d", l, r.statuses[l])
		}
		verdict := "ok"
		if !r.ok() {
			verdict = "DOUBLE CHARGE"
			ok = false
		}
		if r.note != "" {
			verdict += " (" + r.note + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\n", r.scenario, r.sent, b.String(), r.charges, r.want, verdict)
	}
	tw.Flush()
	return ok
}

// deleteRedisKeys deletes every key under prefix (SCAN to the end of the
// keyspace, UNLINK) and returns how many it deleted.
func deleteRedisKeys(url, prefix string) (int, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return 0, err
	}
	c := redis.NewClient(opts)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := 0
	it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for it.Next(ctx) {
		if err := c.Unlink(ctx, it.Val()).Err(); err != nil {
			return n, err
		}
		n++
	}
	return n, it.Err()
}
