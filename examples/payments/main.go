// Command payments is the full payments service of the examples, on the
// framework -framework names: every store (-store), the ledger written
// through the execution's transaction, /metrics and traces, the test hooks
// tests/chaos uses, graceful shutdown. Run it with
//
//	go run ./examples/payments -framework gin -store redis
//
// and see README.md ("The example services") for the HTTP contract it
// serves. Everything but the framework lives once, in
// examples/internal/payments (the handlers' logic is its Routes); each
// file here is one framework's wiring, top to bottom: recovery and request
// ids, authentication that sets the principal, the idem middleware, the
// routes. The short programs to copy are examples/<framework>.
package main

import (
	"fmt"
	"os"

	"github.com/idemkit/idem/examples/internal/payments"
)

// wirings maps -framework to its wiring: the server of app's routes.
var wirings = map[string]func(app *payments.App) (payments.Server, error){
	"nethttp": nethttpServer,
	"gin":     ginServer,
	"echo":    echoServer,
	"echov5":  echov5Server,
	"fiber":   fiberServer,
	"fiberv3": fiberv3Server,
	"grpc":    grpcServer,
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	flags, err := payments.ParseFlags()
	if err != nil {
		return err
	}
	app, err := payments.Open(flags)
	if err != nil {
		return err
	}
	defer app.Close()
	srv, err := wirings[flags.Framework](app)
	if err != nil {
		return err
	}
	return app.Serve(srv)
}
