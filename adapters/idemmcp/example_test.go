package idemmcp_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/adapters/idemmcp"
	idem "github.com/idemkit/idem/core"
)

// store is the application's [idem.Store]: memstore.New() for one process,
// redisstore, pgstore, mongostore or mysqlstore for several instances. The
// example leaves it unset so that this module does not require a store
// module (running tests live in tests/mcp).
var store idem.Store

type payment struct {
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Payee       string `json:"payee"`
}

type receipt struct {
	ID string `json:"id"`
}

// The server side: create_payment runs once per idempotency key;
// get_balance, marked read-only, is untouched.
func Example() {
	engine, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	createPayment := &mcp.Tool{Name: "create_payment", Description: "Pay a payee."}
	getBalance := &mcp.Tool{Name: "get_balance", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}
	server := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "v1"}, nil)
	mcp.AddTool(server, createPayment, func(ctx context.Context, _ *mcp.CallToolRequest, in payment) (*mcp.CallToolResult, receipt, error) {
		info, _ := idem.InfoFromContext(ctx) // info.Key: forward it as the provider's idempotency key
		_ = info
		return nil, receipt{ID: "pay_1"}, nil
	})
	mcp.AddTool(server, getBalance, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, map[string]int64, error) {
		return nil, map[string]int64{"cents": 100}, nil
	})
	server.AddReceivingMiddleware(idemmcp.Middleware(engine, idemmcp.WithTools(createPayment, getBalance)))
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	_ = handler // wrap it with auth.RequireBearerToken (the principal), then serve it
}

// The agent side: one key per logical call, the same key on every retry.
func ExampleClient() {
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	agent := idemmcp.NewClient(func(ctx context.Context) (*mcp.ClientSession, error) {
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://127.0.0.1:8080/mcp"}, nil)
	}, idemmcp.WithAttemptTimeout(10*time.Second))
	defer func() { _ = agent.Close() }()
	_ = func(ctx context.Context) {
		res, err := agent.CallTool(ctx, &mcp.CallToolParams{
			Name:      "create_payment",
			Arguments: payment{AmountCents: 1250, Currency: "EUR", Payee: "acme"},
		})
		if d, ok := idemmcp.ErrorDataOf(err); ok {
			log.Printf("refused: %s (retryable %v)", d.Type, d.Retryable)
		}
		_ = res
	}
}
