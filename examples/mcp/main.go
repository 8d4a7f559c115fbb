// Command mcp is an MCP server exposing a create_payment tool over the
// streamable HTTP transport, guarded by idemmcp, and an agent-like client
// that gives up on slow calls and retries them, as agent runtimes do:
//
//	go run ./examples/mcp
//
// The payment provider takes longer than the agent's 300 ms attempt
// timeout, so the agent sends create_payment again (same idempotency key,
// in _meta.idempotencyKey): it is told the call is in progress, retries,
// and gets the stored receipt. The card is charged once. A key reused with
// another amount is refused; the read-only get_balance is untouched. It
// exits when done.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/adapters/idemmcp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

// Payment is create_payment's input, Receipt its output.
type Payment struct {
	AmountCents int64  `json:"amount_cents" jsonschema:"amount in cents"`
	Currency    string `json:"currency" jsonschema:"ISO 4217 code"`
	Payee       string `json:"payee"`
}

type Receipt struct {
	ID          string `json:"id"`
	AmountCents int64  `json:"amount_cents"`
}

type Balance struct {
	Charges int64 `json:"charges"`
}

func main() {
	if err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(w io.Writer) error {
	out := &lockedWriter{w: w} // server and agent goroutines print
	ctx := context.Background()
	store := memstore.New() // one process; redisstore or pgstore for several
	defer func() { _ = store.Close() }()
	engine, err := idem.New(store, idem.WithEventHook(func(_ context.Context, ev idem.Event) {
		fmt.Fprintf(out, "  server: %s %s\n", ev.Route, ev.Kind)
	}))
	if err != nil {
		return err
	}
	defer func() { _ = engine.Close(ctx) }()

	// The server: create_payment charges through a slow provider.
	var charges atomic.Int64
	createPayment := &mcp.Tool{Name: "create_payment", Description: "Charge the card on file and pay a payee."}
	getBalance := &mcp.Tool{Name: "get_balance", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}
	server := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "v1"}, nil)
	mcp.AddTool(server, createPayment, func(ctx context.Context, _ *mcp.CallToolRequest, in Payment) (*mcp.CallToolResult, Receipt, error) {
		n := charges.Add(1)
		fmt.Fprintf(out, "  provider: charging %d cents (charge #%d)...\n", in.AmountCents, n)
		time.Sleep(time.Second) // the provider is slow; the charge goes through whatever the agent does
		return nil, Receipt{ID: fmt.Sprintf("pay_%d", n), AmountCents: in.AmountCents}, nil
	})
	mcp.AddTool(server, getBalance, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, Balance, error) {
		return nil, Balance{Charges: charges.Load()}, nil
	})
	rec, err := idem.NewRecoverer(engine) // finishes a create_payment whose server crashed, without the agent
	if err != nil {
		return err
	}
	server.AddReceivingMiddleware(idemmcp.Middleware(engine, idemmcp.WithTools(createPayment, getBalance),
		idemmcp.WithRecovery(rec, server, "create_payment")))
	rec.Start()
	defer rec.Stop()
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		if token != "agent-token" {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: "user_42", Expiration: time.Now().Add(time.Hour)}, nil
	}
	handler := auth.RequireBearerToken(verify, nil)(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Shutdown(ctx) }()

	// The agent: 300 ms per attempt, then the same call again, same key.
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	hc := &http.Client{Transport: bearer("agent-token")}
	agent := idemmcp.NewClient(func(ctx context.Context) (*mcp.ClientSession, error) {
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + ln.Addr().String(), HTTPClient: hc}, nil)
	}, idemmcp.WithAttemptTimeout(300*time.Millisecond), idemmcp.WithAttempts(10),
		idemmcp.WithRetryHook(func(attempt int, err error, delay time.Duration) {
			fmt.Fprintf(out, "agent: attempt %d: %v; again in %v with the same key\n", attempt, err, delay.Round(time.Millisecond))
		}))
	defer func() { _ = agent.Close() }()

	key := idemmcp.NewKey() // the agent runtime keeps it with the step, to reuse after its own restart
	pay := Payment{AmountCents: 1250, Currency: "EUR", Payee: "acme"}
	fmt.Fprintln(out, "agent: create_payment 1250 EUR to acme")
	res, err := agent.CallTool(ctx, &mcp.CallToolParams{Name: "create_payment", Arguments: pay, Meta: mcp.Meta{idemmcp.MetaKey: key}})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "agent: got %v (replayed: %v)\n", res.StructuredContent, res.Meta[idemmcp.ReplayedMetaKey] == true)

	fmt.Fprintln(out, "agent: the same key with 99900 cents")
	pay.AmountCents = 99900
	_, err = agent.CallTool(ctx, &mcp.CallToolParams{Name: "create_payment", Arguments: pay, Meta: mcp.Meta{idemmcp.MetaKey: key}})
	d, ok := idemmcp.ErrorDataOf(err)
	if !ok {
		return errors.Join(errors.New("want a refusal"), err)
	}
	fmt.Fprintf(out, "agent: refused, %s: %v\n", d.Type, err)

	res, err = agent.CallTool(ctx, &mcp.CallToolParams{Name: "get_balance"})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "agent: get_balance %v\n", res.StructuredContent)
	if n := charges.Load(); n != 1 {
		return fmt.Errorf("the card was charged %d times", n)
	}
	fmt.Fprintln(out, "charged once")
	return nil
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// bearer adds the agent's bearer token to each request.
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}
