// Package payments is the payments service every framework of
// examples/payments serves: the command line, the store -store names (with
// the SQL stores' purgers), the ledger written through the execution's
// transaction, telemetry, the domain (Service), the HTTP contract's
// handlers (Routes) and graceful shutdown (Serve). A framework's wiring in
// examples/payments only mounts Routes behind its authentication, its idem
// middleware and its recovery.
package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemotel"
)

// App is the service's shared parts, opened from the command line.
type App struct {
	Config Config
	Engine *idem.Engine
	// Service is the domain; Routes(Service) is the HTTP contract.
	Service *Service
	// Metrics serves GET /metrics (Prometheus text format), to be mounted
	// outside authentication.
	Metrics http.Handler
	// Store is the idempotency store the engine uses.
	Store   idem.Store
	closers []func()
	// recoverer is -recover's, set by Recover; Serve runs it.
	recoverer *idem.Recoverer
}

// Open opens what f names: the store (openStore), telemetry (metrics,
// -trace-file), the engine with idemotel's event hook, the ledger and the
// service. Close releases them.
func Open(f Config) (_ *App, err error) {
	app := &App{Config: f}
	defer func() {
		if err != nil {
			app.Close() // what was opened before the failure
		}
	}()
	b, err := openStore(f)
	if err != nil {
		return nil, err
	}
	app.closers = append(app.closers, b.close)
	app.Store = b.store
	metrics, stopTelemetry, err := telemetry(f)
	if err != nil {
		return nil, err
	}
	app.Metrics = metrics
	app.closers = append(app.closers, stopTelemetry)
	hook, err := idemotel.NewEventHook()
	if err != nil {
		return nil, err
	}
	opts := []idem.Option{
		idem.WithRetention(f.TTL),
		idem.WithLease(f.Lease),
		idem.WithStoreTimeout(f.StoreTimeout),
		idem.WithUncertainAfterCrash(f.UncertainAfterCrash),
		idem.WithEventHook(hook),
	}
	if f.Recover {
		opts = append(opts, idem.WithRoute(http.MethodPost, "/v1/payments", idem.RouteRecovery()),
			idemrpc.Recover("/payments.v1.Payments/CreatePayment")) // -framework grpc: grpc-go and Connect
	}
	app.Engine, err = idem.New(b.store, opts...)
	if err != nil {
		return nil, err
	}
	ledger, closeLedger, err := openLedger(f, b)
	if err != nil {
		return nil, err
	}
	app.closers = append(app.closers, closeLedger)
	app.Service = NewService(f.ChargeLatency, ledger)
	if app.Service.card, err = newCardProvider(f); err != nil {
		return nil, err
	}
	return app, nil
}

// Recover sets up -recover's recoverer, which Serve runs: run is the
// framework's whole handler chain (idem.HTTPRunner of the router with its
// middleware, idemfiber.Runner of the app), whose authentication calls
// User. Without -recover it does nothing.
func (a *App) Recover(run idem.Runner) error {
	if !a.Config.Recover || a.Config.NoIdem {
		return nil
	}
	r, err := idem.NewRecoverer(a.Engine, idem.RecoverRequests(run),
		idem.RecoverEvery(a.Config.RecoverEvery), idem.RecoverAttempts(a.Config.RecoverAttempts))
	if err != nil {
		return fmt.Errorf("-recover: %w", err)
	}
	a.recoverer = r
	return nil
}

// User is the principal the service's authentication establishes: the
// stored principal of a recovery run whose Idem-Recovery header value
// (recovery) this process's recoverer issued (idem.Engine.RecoveryPrincipal),
// else the examples' stand-in credential, the X-User-ID header (claimed);
// "" is unauthenticated. A client sending Idem-Recovery gains nothing: an
// unknown nonce falls back to X-User-ID, and the engine refuses the
// request (403 recovery-refused).
func (a *App) User(recovery, claimed string) string {
	if p, ok := a.Engine.RecoveryPrincipal(recovery); ok {
		return p
	}
	return claimed
}

// Close releases what Open opened, in reverse order.
func (a *App) Close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
}

// Server is what Serve runs: *http.Server, or a framework's own server
// (Fiber) behind the same two methods.
type Server interface {
	Serve(ln net.Listener) error
	Shutdown(ctx context.Context) error
}

// Serve listens on a.Config.Addr, prints "listening on http://ADDR" once it
// accepts connections, and serves srv until SIGINT or SIGTERM. Then it
// shuts down gracefully: srv stops accepting and lets in-flight requests
// finish, then the engine's Close waits for the completions it is still
// retrying after a store error, all within 10s (more than the 5s net/http
// waits for a connection that has not sent a request yet). Last it prints
// "executions N", the provider executions (tests/chaos reads both lines).
func (a *App) Serve(srv Server) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", a.Config.Addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening on http://%s\n", ln.Addr()) // after the signal handler: a SIGTERM from now on shuts down cleanly
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if a.recoverer != nil {
		a.recoverer.Start()
		defer a.recoverer.Stop() // on an early return; else stopped below
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	if a.recoverer != nil {
		a.recoverer.Stop() // its runs end before the engine closes
	}
	if err := a.Engine.Close(shutdown); err != nil {
		slog.Warn("idem: completions still retrying were abandoned", "err", err)
	}
	fmt.Printf("executions %d\n", a.Service.Stats().Executions)
	return nil
}
