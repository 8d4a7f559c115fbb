package idemrpc

import (
	"net/http"

	idem "github.com/idemkit/idem/core"
)

// Recover makes the unary RPC procedure (the full method name,
// "/payments.v1.Payments/Create") recoverable on the engine, for idemgrpc
// and idemconnect alike: a call's record keeps the procedure, the request
// message, the principal, the idempotency key and the request metadata
// lines (Connect: header lines) named in metadata, an allow-list that may
// not name credentials (authorization, cookie, x-api-key...: idem.New
// returns an error), so that an idem.Recoverer runs the call again
// through the server's own interceptors and handler (idemgrpc.Runner,
// idemconnect.Runner) when its holder stopped and no client comes back.
// It is idem.WithRoute("POST", procedure, idem.RouteRecovery(metadata...)),
// the route under which both adapters record calls.
func Recover(procedure string, metadata ...string) idem.Option {
	return idem.WithRoute(http.MethodPost, procedure, idem.RouteRecovery(metadata...))
}
