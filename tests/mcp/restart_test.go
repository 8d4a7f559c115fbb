package mcp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/adapters/idemmcp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/redisstore"
)

// The restart tests run this test binary as the server process: with
// restartServerEnv set, TestMain serves the charge tool over streamable
// HTTP on restartAddrEnv, with a Redis store under restartPrefixEnv (so
// that a process started again on the same address finds the records of
// the one killed), until it is killed.
const (
	restartServerEnv = "IDEMMCP_TEST_RESTART_SERVER"
	restartAddrEnv   = "IDEMMCP_TEST_RESTART_ADDR"
	restartPrefixEnv = "IDEMMCP_TEST_RESTART_PREFIX"
	// restartLease is the server's lease: a killed holder's record answers
	// in progress for up to this long after the kill.
	restartLease = 2 * time.Second
	// restartHandler is how long an execution takes.
	restartHandler = 3 * time.Second
)

// runRestartServer is the server process: each execution of charge prints
// "started" when it starts and "done" when it ends, takes restartHandler,
// and answers {"id": "ch_N"}, N the number of executions started on the
// store.
func runRestartServer() int {
	u := os.Getenv("IDEM_REDIS_URL")
	if u == "" {
		u = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rc := redis.NewClient(opt)
	defer func() { _ = rc.Close() }()
	prefix := os.Getenv(restartPrefixEnv)
	e, err := idem.New(redisstore.New(rc, redisstore.WithPrefix(prefix)), idem.WithLease(restartLease), idem.WithRetention(10*time.Minute),
		idem.WithStoreTimeout(restartLease/4), idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	charge := &mcp.Tool{Name: "charge", Description: "Charge a card."}
	s := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "test"}, nil)
	mcp.AddTool(s, charge, func(ctx context.Context, _ *mcp.CallToolRequest, _ payment) (*mcp.CallToolResult, receipt, error) {
		n, err := rc.Incr(ctx, prefix+"started").Result() // across runs: the charge's number
		if err != nil {
			return nil, receipt{}, err
		}
		fmt.Println("started")
		time.Sleep(restartHandler)
		fmt.Println("done")
		return nil, receipt{ID: fmt.Sprintf("ch_%d", n)}, nil
	})
	s.AddReceivingMiddleware(idemmcp.Middleware(e, idemmcp.WithTools(charge),
		idemmcp.WithScope(func(context.Context, *mcp.CallToolRequest) string { return "alice" })))
	ln, err := net.Listen("tcp", os.Getenv(restartAddrEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	srv := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil), ReadHeaderTimeout: time.Minute}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println("listening")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	<-stop // the tests kill it
	return 0
}

// TestClientRidesOutRestart: a tool call through idemmcp.Client with its
// default options (over the go-sdk's streamable HTTP transport with its
// defaults), whose server process is killed mid-execution and started
// again on the same address (the same Redis) after 2, 5 or 20 s, ends with
// the result of the one execution that ran to its end (the takeover's: its
// id is the last start's); a server that never comes back ends the call
// at its time budget (WithMaxElapsed, short here) with a GaveUpError
// naming the key.
func TestClientRidesOutRestart(t *testing.T) {
	t.Parallel()
	for _, down := range []time.Duration{2 * time.Second, 5 * time.Second, 20 * time.Second, -1} {
		name := "down " + down.String()
		if down < 0 {
			name = "never back"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := adaptertest.FreeAddr(t)
			s := adaptertest.StartProcess(t, os.Args[0], []string{"-test.run=^$"}, restartServerEnv+"=1", restartAddrEnv+"="+addr,
				restartPrefixEnv+"=idemtest:mcp:restart:"+rand.Text()[:10]+":")
			var opts []idemmcp.ClientOption
			if down < 0 {
				opts = append(opts, idemmcp.WithMaxElapsed(3*time.Second))
			}
			client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "test"}, nil)
			agent := idemmcp.NewClient(func(ctx context.Context) (*mcp.ClientSession, error) {
				return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr}, nil)
			}, opts...)
			t.Cleanup(func() { _ = agent.Close() })
			key := idemmcp.NewKey()
			type outcome struct {
				res *mcp.CallToolResult
				err error
			}
			r := adaptertest.KillMidCall(t, s, down, func() bool { return s.Lines("started") > 0 }, func() outcome {
				res, err := agent.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge", Arguments: pay, Meta: mcp.Meta{idemmcp.MetaKey: key}})
				return outcome{res, err}
			})
			if down < 0 {
				var g *idemmcp.GaveUpError
				if !errors.As(r.err, &g) || g.Key != key || !errors.Is(r.err, idemmcp.ErrOutOfTime) || !strings.Contains(r.err.Error(), "resume") {
					t.Fatalf("call to a server that never came back: %v; want out of time, naming key %q to resume with", r.err, key)
				}
				return
			}
			s.Kill() // its last lines are read once it is gone: the answer can reach the client before its "done" line reaches the test
			started, done := s.Lines("started"), s.Lines("done")
			if r.err != nil {
				t.Fatalf("server down %v: the call ended with %v; %d executions started, %d ran to their end", down, r.err, started, done)
			}
			if got := receiptOf(t, r.res); got.ID != fmt.Sprintf("ch_%d", started) || done != 1 {
				t.Fatalf("server down %v: the call got %+v; %d executions started, %d ran to their end; want the one completed execution's ch_%d",
					down, got, started, done, started)
			}
			t.Logf("server down %v: the call got %s; %d executions started (the killed one and the takeover), %d completed", down, receiptOf(t, r.res).ID, started, done)
		})
	}
}
