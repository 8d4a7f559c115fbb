package mcp

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/idemmcp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// stdioServerEnv, set to "1", makes the test binary an MCP server on its
// stdin and stdout (TestStdio starts it as a child process).
const stdioServerEnv = "IDEMMCP_TEST_STDIO_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(stdioServerEnv) == "1" {
		os.Exit(runStdioServer())
	}
	if os.Getenv(crashServerEnv) == "1" {
		os.Exit(runCrashServer())
	}
	if os.Getenv(restartServerEnv) == "1" { // a server process of restart_test.go
		os.Exit(runRestartServer())
	}
	flag.Parse()
	// The restart tests mostly wait (for a server process to be down, for
	// a lease to lapse), not on the CPU: run them side by side.
	if f := flag.Lookup("test.parallel"); f != nil && f.Value.String() == strconv.Itoa(runtime.GOMAXPROCS(0)) {
		_ = f.Value.Set("8")
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// payment is create_payment's input, receipt its output.
type payment struct {
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Payee       string `json:"payee"`
	// IdempotencyKey is declared for TestArgumentsChanged's key argument
	// (idemmcp.WithKeyArgument): the go-sdk refuses undeclared arguments.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

type receipt struct {
	ID          string `json:"id"`
	AmountCents int64  `json:"amount_cents"`
}

type balance struct {
	Executions int64 `json:"executions"`
	Conflicts  int64 `json:"conflicts"`
}

// payments is the service behind the tools: it counts executions of the
// mutating tools and reads of the read-only one.
type payments struct {
	executions atomic.Int64
	reads      atomic.Int64
	conflicts  atomic.Int64  // in-progress answers, when an engine's hook counts them
	started    chan struct{} // one value per execution of create_payment
	gate       chan struct{} // when not nil, create_payment waits for it to close
}

func newPayments(gated bool) *payments {
	p := &payments{started: make(chan struct{}, 100)}
	if gated {
		p.gate = make(chan struct{})
	}
	return p
}

// open lets gated executions finish; it may be called more than once.
func (p *payments) open() {
	if p.gate != nil {
		select {
		case <-p.gate:
		default:
			close(p.gate)
		}
	}
}

// newServer returns an MCP server with create_payment and decline_payment
// (mutating) and get_balance (read-only), guarded by idemmcp over e.
func newServer(p *payments, e *idem.Engine, opts ...idemmcp.Option) *mcp.Server {
	create := &mcp.Tool{Name: "create_payment", Description: "Pay a payee."}
	decline := &mcp.Tool{Name: "decline_payment", Description: "A payment the bank declines."}
	get := &mcp.Tool{Name: "get_balance", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}
	s := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "test"}, nil)
	mcp.AddTool(s, create, func(ctx context.Context, _ *mcp.CallToolRequest, in payment) (*mcp.CallToolResult, receipt, error) {
		n := p.executions.Add(1)
		select {
		case p.started <- struct{}{}:
		default: // nobody waits for more than the first starts
		}
		if p.gate != nil {
			<-p.gate // the provider call is under way: it finishes whatever the caller does
		}
		return nil, receipt{ID: fmt.Sprintf("pay_%d_%s", n, in.Payee), AmountCents: in.AmountCents}, nil
	})
	mcp.AddTool(s, decline, func(context.Context, *mcp.CallToolRequest, payment) (*mcp.CallToolResult, receipt, error) {
		n := p.executions.Add(1)
		return nil, receipt{}, fmt.Errorf("card declined (attempt %d)", n)
	})
	mcp.AddTool(s, get, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, balance, error) {
		p.reads.Add(1)
		return nil, balance{Executions: p.executions.Load(), Conflicts: p.conflicts.Load()}, nil
	})
	s.AddReceivingMiddleware(idemmcp.Middleware(e, append([]idemmcp.Option{idemmcp.WithTools(create, decline, get)}, opts...)...))
	return s
}

// events counts an engine's events by kind.
type events struct {
	mu     sync.Mutex
	counts map[idem.EventKind]int
}

func (ev *events) hook() idem.Option {
	return idem.WithEventHook(func(_ context.Context, e idem.Event) {
		ev.mu.Lock()
		defer ev.mu.Unlock()
		if ev.counts == nil {
			ev.counts = map[idem.EventKind]int{}
		}
		ev.counts[e.Kind]++
	})
}

func (ev *events) count(k idem.EventKind) int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return ev.counts[k]
}

func (ev *events) total() int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	n := 0
	for _, c := range ev.counts {
		n += c
	}
	return n
}

// newEngine returns an engine over store, closed at cleanup.
func newEngine(t testing.TB, store idem.Store, opts ...idem.Option) *idem.Engine {
	t.Helper()
	opts = append([]idem.Option{idem.WithRetention(10 * time.Minute), idem.WithStoreTimeout(time.Second), idem.WithLease(10 * time.Second)}, opts...)
	e, err := idem.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Close(ctx)
	})
	return e
}

// newMemStore returns a memory store closed at cleanup.
func newMemStore(t testing.TB) idem.Store {
	s := memstore.New()
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// redisOptions reads IDEM_REDIS_URL (default redis://127.0.0.1:6379/0).
func redisOptions(t testing.TB) *redis.Options {
	t.Helper()
	u := os.Getenv("IDEM_REDIS_URL")
	if u == "" {
		u = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatalf("IDEM_REDIS_URL %q: %v", u, err)
	}
	opt.ContextTimeoutEnabled = true
	return opt
}

// newRedisStores returns n Redis stores, each with its own client (as n
// server instances would have), sharing one fresh key prefix whose keys
// are deleted at cleanup.
func newRedisStores(t testing.TB, n int) []idem.Store {
	t.Helper()
	prefix := "idemtest:mcp:" + rand.Text()[:10] + ":"
	var stores []idem.Store
	for i := range n {
		c := redis.NewClient(redisOptions(t))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err != nil {
			_ = c.Close()
			t.Fatalf("redis: %v (set IDEM_REDIS_URL; source scripts/services.sh)", err)
		}
		if i == 0 {
			t.Cleanup(func() { deletePrefix(c, prefix) })
		}
		t.Cleanup(func() { _ = c.Close() })
		stores = append(stores, redisstore.New(c, redisstore.WithPrefix(prefix)))
	}
	return stores
}

// deletePrefix deletes the keys under prefix.
func deletePrefix(c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
	for iter.Next(ctx) {
		_ = c.Del(ctx, iter.Val()).Err()
	}
}

// serveHTTP serves s over the streamable HTTP transport on a loopback TCP
// listener, behind auth.RequireBearerToken: the bearer token is the user id.
func serveHTTP(t testing.TB, s *mcp.Server) string {
	t.Helper()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: token, Expiration: time.Now().Add(time.Hour)}, nil
	}
	ts := httptest.NewServer(auth.RequireBearerToken(verify, nil)(h))
	t.Cleanup(ts.Close)
	return ts.URL
}

// bearer adds a bearer token to each request.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// cutter dials TCP connections and can cut every one it dialled.
type cutter struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (c *cutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		c.mu.Lock()
		c.conns = append(c.conns, conn)
		c.mu.Unlock()
	}
	return conn, err
}

// cut closes every connection dialled so far.
func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = nil
}

// httpAgent returns an idemmcp.Client for user over the streamable HTTP
// transport to url, with the go-sdk's own reconnection off (the helper's
// retries are under test), closed at cleanup.
func httpAgent(t testing.TB, url, user string, dial func(ctx context.Context, network, addr string) (net.Conn, error), opts ...idemmcp.ClientOption) *idemmcp.Client {
	tr := &http.Transport{DialContext: dial}
	hc := &http.Client{Transport: bearer{token: user, base: tr}}
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "test"}, nil)
	a := idemmcp.NewClient(func(ctx context.Context) (*mcp.ClientSession, error) {
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	}, opts...)
	t.Cleanup(func() {
		_ = a.Close()
		tr.CloseIdleConnections()
	})
	return a
}

// memorySession connects a client named user to s over in-memory
// transports; both ends are closed at cleanup.
func memorySession(t testing.TB, s *mcp.Server, user string) *mcp.ClientSession {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: user, Version: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	return cs
}

// clientName is a WithScope function for in-memory tests: the principal is
// the name the client gave in initialize.
func clientName(_ context.Context, req *mcp.CallToolRequest) string {
	if p := req.Session.InitializeParams(); p != nil && p.ClientInfo != nil {
		return p.ClientInfo.Name
	}
	return ""
}

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// receiptOf returns the structured receipt of a create_payment result.
func receiptOf(t testing.TB, res *mcp.CallToolResult) receipt {
	t.Helper()
	m, ok := res.StructuredContent.(map[string]any)
	if !ok {
		t.Fatalf("structured content %T (%v), want an object", res.StructuredContent, res.StructuredContent)
	}
	id, _ := m["id"].(string)
	cents, _ := m["amount_cents"].(float64)
	return receipt{ID: id, AmountCents: int64(cents)}
}

// replayed reports whether res carries idemmcp's replay marker.
func replayed(res *mcp.CallToolResult) bool {
	v, _ := res.Meta[idemmcp.ReplayedMetaKey].(bool)
	return v
}

// call sends one tools/call with key in _meta ("" for none).
func call(ctx context.Context, cs *mcp.ClientSession, tool, key string, args any) (*mcp.CallToolResult, error) {
	p := &mcp.CallToolParams{Name: tool, Arguments: args}
	if key != "" {
		p.Meta = mcp.Meta{idemmcp.MetaKey: key}
	}
	return cs.CallTool(ctx, p)
}

// errorType returns the ErrorData type of err, "" when it has none.
func errorType(err error) string {
	d, _ := idemmcp.ErrorDataOf(err)
	return d.Type
}
