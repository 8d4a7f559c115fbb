package idemconnect_test

import (
	"context"
	"log"
	"net/http"

	"connectrpc.com/connect"

	"github.com/idemkit/idem/adapters/idemconnect"
	idem "github.com/idemkit/idem/core"
)

// store is the application's [idem.Store]: memstore.New() for one process,
// redisstore, mongostore or pgstore for several instances. The example
// leaves it unset so that this module does not require a store module
// (running tests live in tests/rpc).
var store idem.Store

type userKey struct{}

// userID returns the principal the app's authentication stored.
func userID(ctx context.Context) string { s, _ := ctx.Value(userKey{}).(string); return s }

// newPaymentsHandler stands in for a generated constructor, e.g.
// paymentsv1connect.NewPaymentsHandler(svc, opts...).
func newPaymentsHandler(opts ...connect.HandlerOption) (string, http.Handler) {
	return "/payments.v1.Payments/", http.NotFoundHandler()
}

func Example() {
	engine, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(newPaymentsHandler(
		connect.WithInterceptors(idemconnect.NewInterceptor(engine, idemconnect.WithScope(userID))),
	))
}

func ExampleNewClientInterceptor() {
	// Pass to a generated client constructor: one Idempotency-Key per
	// logical call, reused by every retry.
	opt := connect.WithInterceptors(idemconnect.NewClientInterceptor(idemconnect.WithAttempts(5)))
	_ = opt
}
