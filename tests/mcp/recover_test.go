package mcp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/adapters/idemmcp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

var soak = flag.Bool("soak", false, "play the long runs: TestRecoverMCP with 36 calls per store")

// crashServerEnv, set to "1", makes the test binary an MCP server over
// streamable HTTP with recoverable create_payment (TestRecoverMCP starts
// it as child processes and SIGKILLs them); crashConfigEnv holds its
// crashConfig as JSON.
const (
	crashServerEnv = "IDEMMCP_TEST_CRASH_SERVER"
	crashConfigEnv = "IDEMMCP_TEST_CRASH_CONFIG"
)

// crashConfig is what a crash server runs with.
type crashConfig struct {
	Store       string   // "redis" or "postgres"
	RedisPrefix string   // redisstore.WithPrefix
	PGTable     string   // pgstore.WithTable
	Provider    string   // the provider's URL
	PauseAt     []string // pause points the server's payments are held at, in turn; none: no hold
	Recover     bool     // run a recoverer (every 250ms)
}

// mcpPausePoints are where create_payment can be held, in the order it
// reaches them: its charge step is Repeatable (the provider deduplicates
// by the step's derived key), its receipt step is not (a mail).
var mcpPausePoints = []string{"before-charge", "charge-before-call", "charge-after-call", "receipt-before-call", "receipt-after-call", "after-steps"}

// mcpUncertain: a call cut inside its receipt step ends uncertain (the
// mail's outcome is unknown); every other point completes.
var mcpUncertain = map[string]bool{"receipt-before-call": true, "receipt-after-call": true}

// mcpMails: the receipts a call cut at the point has sent once settled.
var mcpMails = map[string]int64{"receipt-before-call": 0}

// runCrashServer serves create_payment until it is killed, printing
// "listening on URL" and, for each held call, "paused at POINT USER".
func runCrashServer() int {
	var cfg crashConfig
	if err := json.Unmarshal([]byte(os.Getenv(crashConfigEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	var store idem.Store
	switch cfg.Store {
	case "redis":
		opt, err := redis.ParseURL(envOr("IDEM_REDIS_URL", "redis://127.0.0.1:6379/0"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		opt.ContextTimeoutEnabled = true
		store = redisstore.New(redis.NewClient(opt), redisstore.WithPrefix(cfg.RedisPrefix))
	case "postgres":
		pool, err := pgxpool.New(ctx, envOr("IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		store = pgstore.New(pool, pgstore.WithTable(cfg.PGTable))
	}
	e, err := idem.New(store, idem.WithLease(10*time.Second), idem.WithStoreTimeout(2*time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	r, err := idem.NewRecoverer(e, idem.RecoverEvery(250*time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var held atomic.Int64
	pause := func(ctx context.Context, point, user string) {
		if len(cfg.PauseAt) == 0 {
			return
		}
		if n := held.Load(); cfg.PauseAt[int(n)%len(cfg.PauseAt)] == point && held.CompareAndSwap(n, n+1) {
			fmt.Printf("paused at %s %s\n", point, user)
			<-ctx.Done() // until the SIGKILL
		}
	}
	provider := &http.Client{Timeout: time.Minute}
	post := func(ctx context.Context, path string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.Provider+path, nil)
		if err != nil {
			return "", err
		}
		resp, err := provider.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		switch {
		case err != nil:
			return "", fmt.Errorf("provider: %w", err)
		case resp.StatusCode != http.StatusOK:
			return "", fmt.Errorf("provider: %d %s", resp.StatusCode, b)
		}
		return string(b), nil
	}
	create := &mcp.Tool{Name: "create_payment", Description: "Charge the card and mail a receipt."}
	s := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "test"}, nil)
	mcp.AddTool(s, create, func(ctx context.Context, req *mcp.CallToolRequest, in payment) (*mcp.CallToolResult, receipt, error) {
		user := req.Extra.TokenInfo.UserID
		pause(ctx, "before-charge", user)
		id, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			key, _ := idem.StepKey(ctx, "charge")
			pause(ctx, "charge-before-call", user)
			id, err := post(ctx, fmt.Sprintf("/charge?user=%s&key=%s&amount=%d", user, key, in.AmountCents))
			pause(ctx, "charge-after-call", user)
			return id, err
		}, idem.Repeatable())
		if err != nil {
			return nil, receipt{}, err
		}
		_, err = idem.Step(ctx, "receipt", func(ctx context.Context) (string, error) {
			pause(ctx, "receipt-before-call", user)
			_, err := post(ctx, "/email?user="+user)
			pause(ctx, "receipt-after-call", user)
			return "sent", err
		})
		if err != nil {
			return nil, receipt{}, err
		}
		pause(ctx, "after-steps", user)
		return nil, receipt{ID: id, AmountCents: in.AmountCents}, nil
	})
	opts := []idemmcp.Option{idemmcp.WithTools(create)}
	if cfg.Recover {
		opts = append(opts, idemmcp.WithRecovery(r, s, "create_payment"))
		r.Start()
	}
	s.AddReceivingMiddleware(idemmcp.Middleware(e, opts...))
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: token, Expiration: time.Now().Add(time.Hour)}, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	srv := &http.Server{Handler: auth.RequireBearerToken(verify, nil)(h), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintln(os.Stderr, srv.Serve(ln)) // until killed
	return 1
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// crashProvider is the card provider and mailer the crash servers call:
// it outlives them. A charge is idempotent by its key (a repeated key
// returns the first charge's id); a mail is not.
type crashProvider struct {
	latency   time.Duration // of each charge
	mu        sync.Mutex
	charges   map[string]string // by key: the charge id
	byUser    map[string]int64  // charges by user
	mails     map[string]int64  // by user
	inflight  map[string]bool   // charge keys being answered
	conflicts int64             // charges that came while another of their key was answered
}

func newCrashProvider(t *testing.T, latency time.Duration) (*crashProvider, string) {
	p := &crashProvider{latency: latency, charges: map[string]string{}, byUser: map[string]int64{}, mails: map[string]int64{}, inflight: map[string]bool{}}
	ts := httptest.NewServer(p)
	t.Cleanup(ts.Close)
	return p, ts.URL
}

func (p *crashProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	user, key := r.URL.Query().Get("user"), r.URL.Query().Get("key")
	p.mu.Lock()
	defer p.mu.Unlock()
	switch r.URL.Path {
	case "/email":
		p.mails[user]++
		_, _ = io.WriteString(w, "sent")
	case "/charge":
		if p.inflight[key] {
			p.conflicts++
		}
		p.inflight[key] = true
		p.mu.Unlock()
		time.Sleep(p.latency)
		p.mu.Lock()
		delete(p.inflight, key)
		id, ok := p.charges[key]
		if !ok {
			id = "ch_" + strings.ToLower(rand.Text()[:12])
			p.charges[key] = id
			p.byUser[user]++
		}
		_, _ = io.WriteString(w, id)
	default:
		http.NotFound(w, r)
	}
}

// stats returns user's charges and mails, and the conflicts.
func (p *crashProvider) stats(user string) (charges, mails, conflicts int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byUser[user], p.mails[user], p.conflicts
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// crashServer is a crash server child process.
type crashServer struct {
	url   string
	cmd   *exec.Cmd
	lines chan string // stdout after the listening line
	done  chan struct{}
}

// startCrashServer starts the test binary as a crash server with cfg;
// it is killed at cleanup.
func startCrashServer(t *testing.T, cfg crashConfig) *crashServer {
	t.Helper()
	b, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashServerEnv+"=1", crashConfigEnv+"="+string(b))
	logs := &lockedBuffer{}
	cmd.Stderr = logs
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("crash server's log:\n%s", logs.String())
		}
	})
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &crashServer{cmd: cmd, lines: make(chan string, 64), done: make(chan struct{})}
	url := make(chan string, 1)
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				url <- u
				continue
			}
			s.lines <- sc.Text()
		}
	}()
	go func() { _ = cmd.Wait(); close(s.done) }()
	t.Cleanup(s.kill)
	select {
	case s.url = <-url:
		return s
	case <-s.done:
		t.Fatal("the crash server exited before listening")
	case <-time.After(2 * time.Minute):
		t.Fatal("the crash server did not listen in 2 minutes")
	}
	return nil
}

// kill SIGKILLs the server and waits for it.
func (s *crashServer) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// mcpCall is one agent's create_payment call.
type mcpCall struct {
	user, key string
	amount    int64
	point     string // where it was held, "" when answered first
}

// send makes one tools/call of c to url in a session of its own; it
// returns the result or the error (a cut connection when the server was
// killed under it).
func (c mcpCall) send(ctx context.Context, url string) (*mcp.CallToolResult, error) {
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: bearer{token: c.user, base: tr}}
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "test"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	return call(ctx, cs, "create_payment", c.key, payment{AmountCents: c.amount, Currency: "EUR", Payee: "acme"})
}

// scopedKey is c's record key.
func (c mcpCall) scopedKey() string {
	return idem.ScopedKey(c.user, "(do)", idemmcp.OperationPrefix+"create_payment", c.key)
}

// crashStore is a fresh Redis prefix or PostgreSQL table, with the test's
// own Store on it for inspection.
func crashStore(t *testing.T, kind string) (crashConfig, idem.Inspector) {
	t.Helper()
	suffix := strings.ToLower(rand.Text()[:10])
	switch kind {
	case "redis":
		prefix := "idemtest:mcprecover:" + suffix + ":"
		c := redis.NewClient(redisOptions(t))
		t.Cleanup(func() { deletePrefix(c, prefix); _ = c.Close() })
		return crashConfig{Store: kind, RedisPrefix: prefix}, redisstore.New(c, redisstore.WithPrefix(prefix))
	default:
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, envOr("IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test"))
		if err != nil {
			t.Fatal(err)
		}
		table := "mcp_recover_" + suffix
		s := pgstore.New(pool, pgstore.WithTable(table))
		if err := s.EnsureSchema(ctx); err != nil {
			pool.Close()
			t.Fatalf("postgres: %v (set IDEM_POSTGRES_URL; source scripts/services.sh)", err)
		}
		t.Cleanup(func() {
			_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
			_ = s.Close()
			pool.Close()
		})
		return crashConfig{Store: kind, PGTable: table}, s
	}
}

// crashWave sends n calls across two crash servers on cfg's store, A
// holding its calls at pointsA in turn and B at pointsB, and SIGKILLs
// both once every call is held; it returns the calls with their points.
func crashWave(t *testing.T, cfg crashConfig, n int, pointsA, pointsB []string) []mcpCall {
	t.Helper()
	cfgA, cfgB := cfg, cfg
	cfgA.PauseAt, cfgB.PauseAt = pointsA, pointsB
	a, b := startCrashServer(t, cfgA), startCrashServer(t, cfgB)
	run := strings.ToLower(rand.Text()[:8])
	calls := make([]mcpCall, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	answered := make(chan int, n)
	for i := range calls {
		calls[i] = mcpCall{user: fmt.Sprintf("agent-%s-%d", run, i), key: idemmcp.NewKey(), amount: int64(1000 + i)}
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			for ctx.Err() == nil { // until the server is killed under it (what a loaded store answers first is tried again)
				res, err := calls[i].send(ctx, s.url)
				if ctx.Err() != nil {
					return
				}
				if err == nil || errorType(err) == idemmcp.TypeUncertain {
					_ = res
					answered <- i
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
	points := map[string]string{}
	first := map[int]bool{}
	timeout := time.After(4 * time.Minute)
	for len(points)+len(first) < n {
		select {
		case l := <-a.lines:
			recordPause(points, l)
		case l := <-b.lines:
			recordPause(points, l)
		case i := <-answered:
			first[i] = true
		case <-timeout:
			t.Fatalf("%d of %d calls held, %d answered, in 4 minutes", len(points), n, len(first))
		}
	}
	cancel()
	a.kill()
	b.kill()
	wg.Wait()
	for i := range calls {
		if !first[i] {
			calls[i].point = points[calls[i].user]
		}
	}
	return calls
}

func recordPause(points map[string]string, l string) {
	var point, user string
	if _, err := fmt.Sscanf(l, "paused at %s %s", &point, &user); err == nil {
		points[user] = point
	}
}

// waitSettled polls the calls' records until none is in progress (8
// minutes at most) and returns their states.
func waitSettled(t *testing.T, in idem.Inspector, calls []mcpCall) map[string]idem.State {
	t.Helper()
	states := map[string]idem.State{}
	deadline := time.Now().Add(8 * time.Minute)
	for {
		pending := 0
		for _, c := range calls {
			info, found, err := in.Inspect(context.Background(), c.scopedKey())
			if err != nil {
				t.Fatal(err)
			}
			if !found {
				t.Fatalf("%s cut at %s: no record", c.user, c.point)
			}
			states[c.key] = info.State
			if info.State == idem.StateInProgress {
				pending++
			}
		}
		if pending == 0 {
			return states
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls still in progress after 8 minutes", pending, len(calls))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestRecoverMCP crashes create_payment tool calls on Redis and
// PostgreSQL: 6 calls (36 with -soak) held across two server processes
// before, inside (before and after the provider's answer) and after the
// charge step (Repeatable), inside the receipt step (not repeatable:
// before and after the mail) and after the steps; both SIGKILLed, one
// restarted with a recoverer (idemmcp.WithRecovery), no agent retrying.
// Each call ends completed, charged once, or, cut inside the receipt
// step, parked uncertain (charged once, mailed as far as the crash let
// it); the agents' late retries get the stored result replayed, with the
// provider's charge id, or idempotency_outcome_uncertain.
func TestRecoverMCP(t *testing.T) {
	t.Parallel()
	n := len(mcpPausePoints)
	if *soak {
		n *= 6
	}
	for _, kind := range []string{"redis", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			cfg, in := crashStore(t, kind)
			prov, url := newCrashProvider(t, 0)
			cfg.Provider, cfg.Recover = url, true
			rotated := append(slices.Clone(mcpPausePoints[3:]), mcpPausePoints[:3]...)
			calls := crashWave(t, cfg, n, mcpPausePoints, rotated)
			cfg.PauseAt = nil
			c := startCrashServer(t, cfg) // one instance restarted; no agent comes back
			states := waitSettled(t, in, calls)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			for _, call := range calls {
				charges, mails, _ := prov.stats(call.user)
				if charges != 1 {
					t.Errorf("%s cut at %q: %d charges, want 1", call.user, call.point, charges)
				}
				if call.point == "" { // answered before it was held (a loaded store): completed or uncertain, charged once
					continue
				}
				want := idem.StateCompleted
				if mcpUncertain[call.point] {
					want = idem.StateUncertain
				}
				wantMails, ok := mcpMails[call.point]
				if !ok {
					wantMails = 1
				}
				if states[call.key] != want || mails != wantMails {
					t.Errorf("%s cut at %s: %v with %d mails, want %v with %d", call.user, call.point, states[call.key], mails, want, wantMails)
				}
				res, err := call.send(ctx, c.url) // the agent's late retry
				switch {
				case want == idem.StateUncertain && errorType(err) != idemmcp.TypeUncertain:
					t.Errorf("%s cut at %s: the late retry got %v, want %s", call.user, call.point, err, idemmcp.TypeUncertain)
				case want == idem.StateCompleted && err != nil:
					t.Errorf("%s cut at %s: the late retry got %v, want the result replayed", call.user, call.point, err)
				case want == idem.StateCompleted && (!replayed(res) || !strings.HasPrefix(receiptOf(t, res).ID, "ch_") || receiptOf(t, res).AmountCents != call.amount):
					t.Errorf("%s cut at %s: the late retry got %+v (replayed %v), want the recovered receipt replayed", call.user, call.point, res.StructuredContent, replayed(res))
				}
			}
			if _, _, conflicts := prov.stats(""); conflicts != 0 {
				t.Errorf("provider: %d charges came while another of their key ran", conflicts)
			}
		})
	}
}

// TestRecoverMCPRaces crashes 3 calls inside their charge step (the
// provider taking 300ms a charge) on Redis (and PostgreSQL with -soak),
// then starts three servers with recoverers while every agent retries
// through them at once: each record runs once at a time (the provider
// never sees two charges under one key at once), each call is charged
// once, and every server replays the same receipt.
func TestRecoverMCPRaces(t *testing.T) {
	t.Parallel()
	kinds := []string{"redis"}
	if *soak {
		kinds = append(kinds, "postgres")
	}
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			recoverMCPRaces(t, kind)
		})
	}
}

// recoverMCPRaces is TestRecoverMCPRaces on a store of kind.
func recoverMCPRaces(t *testing.T, kind string) {
	const n = 3
	cfg, _ := crashStore(t, kind)
	prov, url := newCrashProvider(t, 300*time.Millisecond)
	cfg.Provider, cfg.Recover = url, true
	cut := []string{"charge-after-call"}
	calls := crashWave(t, cfg, n, cut, cut)
	cfg.PauseAt = nil
	var live []*crashServer
	for range 3 {
		live = append(live, startCrashServer(t, cfg))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	ids := make([]string, n)
	var agents sync.WaitGroup
	for i, c := range calls {
		agents.Go(func() {
			for {
				res, err := c.send(ctx, live[i%3].url)
				if err == nil {
					ids[i] = receiptOf(t, res).ID
					return
				}
				if errorType(err) != idemmcp.TypeInProgress && errorType(err) != idemmcp.TypeStoreUnavailable || ctx.Err() != nil {
					t.Errorf("%s: %v, want the receipt", c.user, err)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	agents.Wait()
	for i, c := range calls {
		if charges, _, _ := prov.stats(c.user); charges != 1 {
			t.Errorf("%s: %d charges, want 1", c.user, charges)
		}
		for _, s := range live {
			res, err := c.send(ctx, s.url)
			if err != nil || !replayed(res) || receiptOf(t, res).ID != ids[i] {
				t.Errorf("%s at %s: %v (%v), want %s replayed", c.user, s.url, res, err, ids[i])
			}
		}
	}
	if _, _, conflicts := prov.stats(""); conflicts != 0 {
		t.Errorf("provider: %d charges came while another of their key ran: a record ran twice at once", conflicts)
	}
}
