package mcp

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/adapters/idemmcp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

// duplicatesEnv tells the stdio server how many in-progress answers to
// wait for before letting create_payment finish.
const duplicatesEnv = "IDEMMCP_TEST_DUPLICATES"

// runStdioServer serves the payments tools on stdin and stdout until
// stdin closes: a local MCP server as an agent runtime starts one, its
// principal the local user. create_payment waits until the engine has
// answered IDEMMCP_TEST_DUPLICATES calls "in progress" (or 60 s).
func runStdioServer() int {
	store := memstore.New()
	defer func() { _ = store.Close() }()
	p := newPayments(true)
	e, err := idem.New(store, idem.WithEventHook(func(_ context.Context, ev idem.Event) {
		if ev.Kind == idem.EventConflict {
			p.conflicts.Add(1)
		}
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	want, _ := strconv.ParseInt(os.Getenv(duplicatesEnv), 10, 64)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		deadline := time.Now().Add(time.Minute)
		for p.conflicts.Load() < want && time.Now().Before(deadline) {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		p.open()
	})
	s := newServer(p, e, idemmcp.WithScope(func(context.Context, *mcp.CallToolRequest) string { return "local-user" }))
	err = s.Run(context.Background(), &mcp.StdioTransport{})
	close(stop)
	wg.Wait()
	p.open()
	_ = e.Close(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Twenty concurrent duplicates over stdio, to this test binary started as
// a server (the go-sdk's CommandTransport): create_payment runs once and
// every call gets its receipt.
func TestStdio(t *testing.T) {
	const n = 20
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), stdioServerEnv+"=1", duplicatesEnv+"="+strconv.Itoa(n-1))
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "test"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	connected := false
	agent := idemmcp.NewClient(func(context.Context) (*mcp.ClientSession, error) {
		if connected {
			return nil, fmt.Errorf("the stdio session ended")
		}
		connected = true
		return cs, nil
	}, idemmcp.WithAttempts(60))
	defer func() {
		if err := agent.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	key := idemmcp.NewKey()
	results := make([]*mcp.CallToolResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = agent.CallTool(ctx, &mcp.CallToolParams{Name: "create_payment", Arguments: pay, Meta: mcp.Meta{idemmcp.MetaKey: key}})
		})
	}
	wg.Wait()
	fresh := 0
	for i := range n {
		if errs[i] != nil {
			t.Errorf("call %d: %v", i, errs[i])
			continue
		}
		if r := receiptOf(t, results[i]); r.ID != "pay_1_initech" {
			t.Errorf("call %d: receipt %+v, want pay_1_initech", i, r)
		}
		if !replayed(results[i]) {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d results without the replay marker, want 1", fresh)
	}
	res, err := agent.CallTool(ctx, &mcp.CallToolParams{Name: "get_balance"})
	if err != nil {
		t.Fatal(err)
	}
	b := res.StructuredContent.(map[string]any)
	if b["executions"] != float64(1) || b["conflicts"].(float64) < n-1 {
		t.Errorf("server reports %v executions and %v in-progress answers, want 1 and at least %d", b["executions"], b["conflicts"], n-1)
	}
}
