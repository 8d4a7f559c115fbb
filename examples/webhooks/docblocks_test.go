package main

import (
	"net/http"
	"os"
	"time"

	"github.com/idemkit/idem/adapters/idemwebhook"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

// The webhook blocks of README.md and of idemwebhook's doc comment,
// compiled (tools/release TestDocGoBlocks); nothing here runs.
func Example_readmeWebhooks() {
	store := memstore.New()
	mux := http.NewServeMux()
	var handleStripe, handleBilling http.Handler
	// doc: README.md
	engine, err := idem.New(store, idem.WithRetention(4*24*time.Hour)) // outlast the senders' retries (Stripe: 3 days)

	stripe, err := idemwebhook.NewStripe(os.Getenv("STRIPE_WEBHOOK_SECRET"))             // Stripe-Signature
	billing, err := idemwebhook.NewStandardWebhooks(os.Getenv("BILLING_WEBHOOK_SECRET")) // webhook-id, -timestamp, -signature
	mux.Handle("POST /webhooks/stripe", idemwebhook.New(engine, "stripe", stripe)(handleStripe))
	mux.Handle("POST /webhooks/billing", idemwebhook.New(engine, "billing", billing)(handleBilling))
	// Gin: r.POST(path, gin.WrapH(h)); Echo v4, v5: e.POST(path, echo.WrapHandler(h)); Fiber v2: app.Post(path, adaptor.HTTPHandler(h)); Fiber v3: app.Post(path, h)
	// doc end
	_ = err
}

func Example_idemwebhookDoc() {
	mux := http.NewServeMux()
	var engine *idem.Engine
	var stripeScheme idemwebhook.Scheme
	var handler http.Handler
	// doc: adapters/idemwebhook/doc.go
	mux.Handle("POST /webhooks/stripe", idemwebhook.New(engine, "stripe", stripeScheme)(handler))
	// doc end
}
