package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/adapters/idemmcp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
)

// TestClientWaitsOutTakeover: a tool call retried by idemmcp.Client with
// its default options after the holder of the call crashed mid-handler
// (past its idem.Step, its 10s lease no longer renewed, so duplicates get
// in-progress answers until it lapses) waits the answers out and gets the
// takeover's result, with the step's journaled value (one charge); a call
// whose transport fails is retried for the time budget and the error names
// the key.
func TestClientWaitsOutTakeover(t *testing.T) {
	t.Parallel()
	store := adaptertest.CrashableJournal(newMemStore(t))
	e := newEngine(t, store, idem.WithLease(10*time.Second), idem.WithStoreTimeout(250*time.Millisecond), idem.WithLogger(slog.New(slog.DiscardHandler)))
	var runs, charges, journaled atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	crashed := make(chan struct{}) // holds the first run, the crashed holder, until the end
	defer close(crashed)
	tool := &mcp.Tool{Name: "charge", Description: "Charge a card."}
	s := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "test"}, nil)
	mcp.AddTool(s, tool, func(ctx context.Context, _ *mcp.CallToolRequest, in payment) (*mcp.CallToolResult, receipt, error) {
		run := runs.Add(1)
		id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
			return fmt.Sprintf("ch_%d", charges.Add(1)), nil
		})
		if err != nil {
			return nil, receipt{}, err
		}
		journaled.Add(1)
		if run == 1 {
			<-crashed
		}
		return nil, receipt{ID: fmt.Sprintf("%s_run%d", id, run), AmountCents: in.AmountCents}, nil
	})
	s.AddReceivingMiddleware(idemmcp.Middleware(e, idemmcp.WithTools(tool), idemmcp.WithScope(clientName)))

	first := memorySession(t, s, "alice")
	wg.Go(func() { _, _ = call(context.Background(), first, "charge", "k-crash", pay) }) // its answer is not the key's
	waitFor(t, "the first run to pass its step", func() bool { return journaled.Load() == 1 })

	var mu sync.Mutex
	var servers []*mcp.ServerSession
	var inProgress int
	agent := idemmcp.NewClient(func(ctx context.Context) (*mcp.ClientSession, error) {
		ct, st := mcp.NewInMemoryTransports()
		ss, err := s.Connect(ctx, st, nil)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		servers = append(servers, ss)
		mu.Unlock()
		return mcp.NewClient(&mcp.Implementation{Name: "alice", Version: "test"}, nil).Connect(ctx, ct, nil)
	}, idemmcp.WithRetryHook(func(_ int, err error, _ time.Duration) {
		if errorType(err) == idemmcp.TypeInProgress {
			mu.Lock()
			inProgress++
			mu.Unlock()
		}
	}))
	defer func() {
		_ = agent.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, ss := range servers {
			_ = ss.Wait()
		}
	}()
	start := time.Now()
	res, err := agent.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge", Arguments: pay, Meta: mcp.Meta{idemmcp.MetaKey: "k-crash"}})
	if err != nil {
		t.Fatalf("retry after the crash: %v after %v; want the takeover's result", err, time.Since(start))
	}
	if r := receiptOf(t, res); r.ID != "ch_1_run2" || charges.Load() != 1 {
		t.Fatalf("retry got %+v, %d charges; want the takeover's ch_1_run2 (the journaled charge), one charge", r, charges.Load())
	}
	mu.Lock()
	waited := inProgress
	mu.Unlock()
	if waited == 0 {
		t.Fatal("the retry never got an in-progress answer: the test waited for nothing")
	}
	t.Logf("the retry got the takeover's result after %v and %d in-progress answers", time.Since(start).Round(time.Millisecond), waited)

	var connects atomic.Int64
	down := idemmcp.NewClient(func(context.Context) (*mcp.ClientSession, error) {
		connects.Add(1)
		return nil, errors.New("connection refused")
	}, idemmcp.WithBackoff(time.Millisecond, time.Millisecond), idemmcp.WithMaxElapsed(time.Second))
	defer func() { _ = down.Close() }()
	_, err = down.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge", Arguments: pay, Meta: mcp.Meta{idemmcp.MetaKey: "k-down"}})
	var g *idemmcp.GaveUpError
	if !errors.As(err, &g) || !errors.Is(err, idemmcp.ErrOutOfTime) || g.Key != "k-down" || !strings.Contains(err.Error(), `"k-down"`) || connects.Load() < 2 {
		t.Fatalf("call whose transport fails: %v after %d attempts; want out of time, retried, naming key k-down", err, connects.Load())
	}
}

// TestClientStopsOnRefusal: a server that refuses the client (HTTP 401 to
// initialize: a retry with the same credentials cannot change it) ends the
// call at once with the transport's error, not after the time budget.
func TestClientStopsOnRefusal(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no token", http.StatusUnauthorized)
	}))
	defer srv.Close()
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "test"}, nil)
	var connects atomic.Int64
	agent := idemmcp.NewClient(func(ctx context.Context) (*mcp.ClientSession, error) {
		connects.Add(1)
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1}, nil)
	})
	defer func() { _ = agent.Close() }()
	_, err := agent.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge", Arguments: pay, Meta: mcp.Meta{idemmcp.MetaKey: "k-401"}})
	var g *idemmcp.GaveUpError
	if err == nil || errors.As(err, &g) || !strings.HasSuffix(err.Error(), "Unauthorized") || connects.Load() != 1 {
		t.Fatalf("call refused with 401: %v after %d connects; want the refusal after one", err, connects.Load())
	}
}
