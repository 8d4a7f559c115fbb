// Command demo shows idem keeping every kind of operation it exists for
// once per key under the things real clients do: payments under double
// clicks, timeouts and retries, provider failures and reused keys; an
// order, a stock decrement and an email retried after a lost answer; and a
// sign-up on a table whose email column is unique, retried with idem (the
// same 201) and without (the same service with -no-idem: the constraint
// keeps one row, and the retry gets its 409 for a sign-up that succeeded). It builds the payments service (examples/payments), starts it
// on each framework on a free loopback port as its own process, plays the scenarios, and prints a table
// per framework with the idem decisions the service counted on its /metrics,
// and nothing else: the services' logs go to a file that is shown only on
// failure. With -store redis its keys live under their own prefix
// (-redis-prefix, default "idem-demo:"), deleted when it is done; with -store postgres its tables
// live in their own schema (-postgres-schema, default idem_demo), and with
// -store mysql in their own database (-mysql-dsn, default database
// idem_demo, created if missing); with either, every payment is a row
// written through its execution's transaction. It exits 1 if any
// operation ran more often than it should or answered otherwise.
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
	"maps"
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

	bin, err := procs.Build(context.Background(), dir, "payments")
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
		args := []string{"-framework", name, "-store", *store, "-redis-url", *redisURL, "-redis-prefix", *redisPrefix,
			"-mongo-uri", *mongoURI, "-postgres-url", *pgURL, "-postgres-schema", *pgSchema, "-mysql-dsn", *mysqlDSN, "-charge-latency", latency.String()}
		p, err := procs.Start(bin, logs, args...)
		if err != nil {
			fail(err, logPath)
		}
		// The same service without idem, for the sign-up a unique
		// constraint alone protects.
		plain, err := procs.Start(bin, logs, append(args, "-no-idem")...)
		if err != nil {
			p.Stop()
			fail(err, logPath)
		}
		d := &demo{url: p.URL, plainURL: plain.URL, latency: *latency, client: &http.Client{Timeout: 30 * time.Second}}
		rows := d.run()
		counted, err := procs.Scrape(d.client, p.URL)
		p.Stop()
		plain.Stop()
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
		fmt.Println("FAIL: an operation ran more often than its keys allow, or answered otherwise")
		os.Exit(1)
	}
	fmt.Println("OK: one charge per logical payment; one order, stock decrement, email and sign-up per key")
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
	url      string // the service
	plainURL string // the same service with -no-idem
	latency  time.Duration
	client   *http.Client
	err      error // the first failure to read the service's stats
}

type row struct {
	scenario string
	sent     int
	statuses map[string]int
	executed int64 // what the scenario counts: charges, orders, ...
	want     int64
	ids      int // distinct ids of successful answers
	maxIDs   int
	check    map[string]int // statuses the scenario must see, when set
	note     string
}

type answer struct {
	status   int
	replayed bool
	id       string
	body     []byte
}

func newKey() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// call is one request of a scenario.
type call struct {
	path, body string
	user, key  string
}

// payment is the call of POST /v1/payments of amount.
func payment(user, key string, amount int) call {
	return call{"/v1/payments", fmt.Sprintf(`{"amount":%d,"currency":"eur"}`, amount), user, key}
}

func (d *demo) do(client *http.Client, base string, k call) (answer, error) {
	req, _ := http.NewRequest(http.MethodPost, base+k.path, strings.NewReader(k.body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", k.user)
	req.Header.Set("Idempotency-Key", k.key)
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
	return answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", id: p.ID, body: b}, nil
}

// stats is GET /v1/stats of the service at base.
type stats struct {
	Executions      int64 `json:"executions"`
	Orders          int64 `json:"orders"`
	StockDecrements int64 `json:"stock_decrements"`
	EmailsSent      int64 `json:"emails_sent"`
	Signups         int64 `json:"signups"`
}

// stats returns the counters of the service at base; a failure to read
// them is kept in d.err.
func (d *demo) stats(base string) stats {
	var s stats
	resp, err := d.client.Get(base + "/v1/stats")
	if err == nil {
		defer resp.Body.Close()
		if err = json.NewDecoder(resp.Body).Decode(&s); err == nil {
			return s
		}
	}
	if d.err == nil {
		d.err = fmt.Errorf("GET %s/v1/stats: %w", base, err)
	}
	return s
}

// executions returns the service's provider executions so far.
func (d *demo) executions() int64 { return d.stats(d.url).Executions }

// play runs s and counts the answers and what it executed.
func (d *demo) play(s scenario) row {
	r := row{scenario: s.name, want: s.want, note: s.note, statuses: map[string]int{}, maxIDs: 1, check: s.statuses}
	if s.maxIDs > 0 {
		r.maxIDs = s.maxIDs
	}
	base := d.url
	if s.plain {
		base = d.plainURL
	}
	count := s.count
	if count == nil {
		count = func(st stats) int64 { return st.Executions }
	}
	var mu sync.Mutex
	ids := map[string]bool{}
	before := count(d.stats(base))
	note := s.play(d, func(c *http.Client, k call) answer {
		a, err := d.do(c, base, k)
		mu.Lock()
		defer mu.Unlock()
		r.sent++
		label := "timeout"
		if err == nil {
			label = fmt.Sprint(a.status)
			if a.replayed {
				label += " replay"
			}
			if a.status < 300 {
				ids[a.id] = true
			}
		}
		r.statuses[label]++
		return a
	})
	if note != "" {
		r.note = note + "; " + r.note
	}
	r.executed = count(d.stats(base)) - before
	r.ids = len(ids)
	return r
}

// retry sends until the answer is not 409, as a well-behaved client honouring Retry-After does.
func retry(send sender, c *http.Client, k call) answer {
	for i := 0; ; i++ {
		a := send(c, k)
		if a.status != http.StatusConflict || i == 50 {
			return a
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sender sends one request and records its answer in the row.
type sender func(c *http.Client, k call) answer

// scenario is one row of the table: what clients do, and what that should
// execute.
type scenario struct {
	name string
	want int64
	note string
	// count selects what the row counts from GET /v1/stats (nil:
	// provider executions, i.e. charges).
	count func(stats) int64
	// statuses, when set, are exactly the answers the row must see.
	statuses map[string]int
	maxIDs   int  // distinct successful ids allowed (0: 1)
	plain    bool // sent to the service without idem
	// play sends the requests; it may return a note for the result column.
	play func(d *demo, send sender) string
}

var scenarios = []scenario{
	{name: "50 concurrent double-clicks, one key", want: 1, play: func(d *demo, send sender) string {
		key := newKey()
		var wg sync.WaitGroup
		for range 50 {
			wg.Add(1)
			go func() { defer wg.Done(); send(d.client, payment("alice", key, 1999)) }()
		}
		wg.Wait()
		c := &http.Client{Transport: idemclient.New()} // waits out 409s as Retry-After says
		defer c.CloseIdleConnections()
		send(c, payment("alice", key, 1999)) // the client finally reads its result
		return ""
	}},
	{name: "client times out mid-request, idemclient retries", want: 1, note: "one call: its attempts share the key", play: func(d *demo, send sender) string {
		// idemclient abandons the attempt after latency/3, re-sends it with
		// the same key, waits out the 409 (Retry-After) and gets the replay.
		c := &http.Client{Transport: idemclient.New(idemclient.WithAttemptTimeout(d.latency/3), idemclient.WithMaxAttempts(20))}
		defer c.CloseIdleConnections()
		send(c, payment("alice", newKey(), 2500))
		return ""
	}},
	{name: "provider 5xx, then retry", want: 2, note: "a 5xx is not stored: the retry runs again by design", play: func(d *demo, send sender) string {
		key := newKey()
		send(d.client, payment("alice", key, 5000))
		retry(send, d.client, payment("alice", key, 5000))
		return ""
	}},
	{name: "card declined (402), then retry", want: 1, note: "a 4xx is stored and replayed", play: func(d *demo, send sender) string {
		key := newKey()
		send(d.client, payment("alice", key, 4000))
		retry(send, d.client, payment("alice", key, 4000))
		return ""
	}},
	{name: "handler panics (500), then retry", want: 2, note: "a panic releases the key: the retry runs again", play: func(d *demo, send sender) string {
		key := newKey()
		send(d.client, payment("alice", key, 6000))
		retry(send, d.client, payment("alice", key, 6000))
		return ""
	}},
	{name: "key reused with another amount", want: 1, note: "422, nothing charged twice", play: func(d *demo, send sender) string {
		key := newKey()
		send(d.client, payment("alice", key, 1000))
		send(d.client, payment("alice", key, 2000))
		send(d.client, payment("alice", key, 1000))
		return ""
	}},
	{name: "two users, same key", want: 2, maxIDs: 2, note: "keys are scoped per user", play: func(d *demo, send sender) string {
		key := newKey()
		send(d.client, payment("alice", key, 1500))
		send(d.client, payment("bob", key, 1500))
		return ""
	}},
	{name: "order: answer lost, retried twice", want: 1, note: "counts orders placed: the retries get the first answer",
		count: func(s stats) int64 { return s.Orders }, statuses: map[string]int{"201": 1, "201 replay": 2},
		play: func(d *demo, send sender) string {
			k := call{"/v1/orders", `{"sku":"book","quantity":2}`, "alice", newKey()}
			for range 3 {
				send(d.client, k)
			}
			return ""
		}},
	{name: "stock: decrement by 1, retried twice", want: 1, note: "the retries take no more",
		count: func(s stats) int64 { return s.StockDecrements }, statuses: map[string]int{"200": 1, "200 replay": 2},
		play: func(d *demo, send sender) string {
			sku := "sku-" + newKey()[:8]
			k := call{"/v1/stock/decrements", `{"sku":"` + sku + `","quantity":1}`, "alice", newKey()}
			var last answer
			for range 3 {
				last = send(d.client, k)
			}
			var st struct {
				Remaining int64 `json:"remaining"`
			}
			_ = json.Unmarshal(last.body, &st)
			return fmt.Sprintf("stock 100 → %d", st.Remaining)
		}},
	{name: "email: answer lost, retried", want: 1, note: "counts emails sent: the retry sends none",
		count: func(s stats) int64 { return s.EmailsSent }, statuses: map[string]int{"202": 1, "202 replay": 1},
		play: func(d *demo, send sender) string {
			k := call{"/v1/emails", `{"to":"alice@example.com","subject":"Your receipt"}`, "alice", newKey()}
			send(d.client, k)
			send(d.client, k)
			return ""
		}},
	{name: "sign-up, unique email: retried, with idem", want: 1, note: "counts accounts created: the retry gets the same 201",
		count: func(s stats) int64 { return s.Signups }, statuses: map[string]int{"201": 1, "201 replay": 1},
		play: func(d *demo, send sender) string {
			k := call{"/v1/signups", `{"email":"` + newKey()[:10] + `@example.com"}`, "alice", newKey()}
			send(d.client, k)
			send(d.client, k)
			return ""
		}},
	{name: "sign-up, unique email: retried, without idem", want: 1, plain: true,
		note:  "the constraint keeps one account, but the retry of a sign-up that succeeded gets its 409",
		count: func(s stats) int64 { return s.Signups }, statuses: map[string]int{"201": 1, "409": 1},
		play: func(d *demo, send sender) string {
			k := call{"/v1/signups", `{"email":"` + newKey()[:10] + `@example.com"}`, "alice", newKey()}
			send(d.client, k)
			send(d.client, k)
			return ""
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

// ok reports whether the scenario executed what it should, no logical
// operation succeeded under more ids than it may, and the answers were the
// scenario's.
func (r row) ok() bool {
	return r.executed == r.want && r.ids <= r.maxIDs && (r.check == nil || maps.Equal(r.check, r.statuses))
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

// printTable prints rows and reports whether every row is ok.
func printTable(rows []row) bool {
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\trequests\tstatus codes seen\texecuted\texpected\tresult")
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
			verdict = "FAIL"
			ok = false
		}
		if r.note != "" {
			verdict += " (" + r.note + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\n", r.scenario, r.sent, b.String(), r.executed, r.want, verdict)
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
