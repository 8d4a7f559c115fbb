package main

import (
	"context"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/adapters/idemmcp"
	idem "github.com/idemkit/idem/core"
)

type (
	paymentIn  struct{ Amount int }
	paymentOut struct{ ID string }
)

// The MCP blocks of README.md and of idemmcp's doc comment, compiled
// (tools/release TestDocGoBlocks); nothing here runs.
func Example_readmeMCP() {
	var engine *idem.Engine
	var createPayment, getBalance *mcp.Tool
	var handleCreatePayment, handleGetBalance mcp.ToolHandlerFor[paymentIn, paymentOut]
	var verify auth.TokenVerifier
	var getServer func(*http.Request) *mcp.Server
	client := mcp.NewClient(&mcp.Implementation{Name: "agent"}, nil)
	ctx, url := context.Background(), "http://127.0.0.1:8080/mcp"
	var args map[string]any
	// doc: README.md
	server := mcp.NewServer(&mcp.Implementation{Name: "payments"}, nil)
	mcp.AddTool(server, createPayment, handleCreatePayment)
	mcp.AddTool(server, getBalance, handleGetBalance) // Annotations{ReadOnlyHint: true}: untouched
	server.AddReceivingMiddleware(idemmcp.Middleware(engine, idemmcp.WithTools(createPayment, getBalance)))
	handler := auth.RequireBearerToken(verify, nil)(mcp.NewStreamableHTTPHandler(getServer, nil)) // TokenInfo.UserID: the principal

	agent := idemmcp.NewClient(func(ctx context.Context) (*mcp.ClientSession, error) {
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	}, idemmcp.WithAttemptTimeout(10*time.Second))
	res, err := agent.CallTool(ctx, &mcp.CallToolParams{Name: "create_payment", Arguments: args})
	// doc end
	_, _, _ = handler, res, err
}

func Example_idemmcpDoc() {
	var engine *idem.Engine
	var createPayment, getBalance *mcp.Tool
	var handleCreatePayment, handleGetBalance mcp.ToolHandlerFor[paymentIn, paymentOut]
	client := mcp.NewClient(&mcp.Implementation{Name: "agent"}, nil)
	ctx, url := context.Background(), "http://127.0.0.1:8080/mcp"
	var args map[string]any
	// doc: adapters/idemmcp/doc.go
	server := mcp.NewServer(&mcp.Implementation{Name: "payments"}, nil)
	mcp.AddTool(server, createPayment, handleCreatePayment)
	mcp.AddTool(server, getBalance, handleGetBalance) // ReadOnlyHint: untouched
	server.AddReceivingMiddleware(idemmcp.Middleware(engine, idemmcp.WithTools(createPayment, getBalance)))

	agent := idemmcp.NewClient(func(ctx context.Context) (*mcp.ClientSession, error) {
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	}, idemmcp.WithAttemptTimeout(10*time.Second))
	res, err := agent.CallTool(ctx, &mcp.CallToolParams{Name: "create_payment", Arguments: args})
	// doc end
	_, _ = res, err
	_ = time.Second
}

func Example_readmeMCPRecovery() {
	var engine *idem.Engine
	var rec *idem.Recoverer
	server := mcp.NewServer(&mcp.Implementation{Name: "payments"}, nil)
	// doc: README.md
	server.AddReceivingMiddleware(idemmcp.Middleware(engine, idemmcp.WithRecovery(rec, server, "create_payment")))
	// doc end
}

func Example_idemmcpRecoveryDoc() {
	var engine *idem.Engine
	var createPayment *mcp.Tool
	server := mcp.NewServer(&mcp.Implementation{Name: "payments"}, nil)
	// doc: adapters/idemmcp/doc.go
	rec, err := idem.NewRecoverer(engine)
	server.AddReceivingMiddleware(idemmcp.Middleware(engine, idemmcp.WithTools(createPayment),
		idemmcp.WithRecovery(rec, server, "create_payment")))
	rec.Start()
	// doc end
	_ = err
}
