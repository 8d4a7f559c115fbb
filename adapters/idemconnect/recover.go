package idemconnect

import (
	"net/http"

	idem "github.com/idemkit/idem/core"
)

// Runner returns the idem.Runner of recovered calls of Connect procedures
// made recoverable with idemrpc.Recover: it serves each one with h, the
// handler the procedures are mounted on with the service's middleware
// (the mux, authentication outside), in-process, as a unary call of the
// Connect protocol (POST to the procedure, Content-Type
// application/proto, Connect-Protocol-Version 1) carrying the request
// message, the idempotency key, the declared header lines and
// idem.RecoveryHeader. The service's authentication calls
// idem.Engine.RecoveryPrincipal with that header's value, as on HTTP, and
// authenticates the call as the principal it returns. Requests of the
// engine's HTTP routes served by h run as idem.HTTPRunner runs them.
func Runner(h http.Handler) idem.Runner {
	run := idem.HTTPRunner(h)
	return func(req *http.Request) (int, error) {
		req.Header.Set("Connect-Protocol-Version", "1")
		return run(req)
	}
}
