// Command echo is the payments API on Echo v4 with idem on its mutating
// routes. run below wires everything, top to bottom: the store, the engine,
// the authentication that sets the principal, the idem middleware, the
// routes. Handlers return errors, which Echo's error handler renders as
// problems. Run it with
//
//	go run ./examples/echo -store memory
//
// and see README.md for the HTTP contract every example serves.
//
// This folder is a complete program, copyable on its own (README.md,
// "Running an example as your own module"): main.go is this framework's
// wiring; store.go (the command line, the store and its purger, the
// payments ledger), telemetry.go (/metrics, traces) and payments.go (the
// fake domain) are the same in every example folder, duplicated so that
// each folder stands alone.
package main

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

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/idemkit/idem/adapters/idemecho"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemotel"
)

func main() {
	if err := run(parseFlags()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(flags config) error {
	// The store -store names (store.go): memory for one process; Redis,
	// MongoDB, PostgreSQL or MySQL shared by several instances. The SQL
	// stores run a purger that deletes expired records; closeStore stops it.
	store, closeStore, err := openStore(flags)
	if err != nil {
		return err
	}
	defer closeStore()

	// Telemetry (telemetry.go): OpenTelemetry metrics served on GET /metrics
	// (Prometheus text), spans to -trace-file. idemotel turns the engine's
	// events into metrics and span attributes.
	metrics, stopTelemetry, err := telemetry(flags)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	hook, err := idemotel.NewEventHook()
	if err != nil {
		return err
	}

	// The engine: the rules every protected route shares.
	engine, err := idem.New(store,
		idem.WithRetention(flags.TTL),
		idem.WithLease(flags.Lease),
		idem.WithStoreTimeout(flags.StoreTimeout),
		idem.WithUncertainAfterCrash(flags.UncertainAfterCrash),
		idem.WithEventHook(hook),
	)
	if err != nil {
		return err
	}

	// The middleware: keys are scoped by the principal authenticate sets.
	idempotent := idemecho.New(engine, idemecho.WithScope(func(c echo.Context) string {
		s, _ := c.Get("user_id").(string)
		return s
	}))
	if flags.NoIdem { // the benchmarks' baseline: the same service, unprotected
		idempotent = func(next echo.HandlerFunc) echo.HandlerFunc { return next }
	}

	// The routes: recovery and request ids outside everything (idem never
	// stores or replays what they set: a replay carries this exchange's
	// X-Request-Id), then authentication, then idem, then the handler (Echo runs route middleware in the order given).
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = problem
	e.Use(middleware.Recover(), middleware.RequestID())
	// The payments ledger (store.go): with -store postgres or mysql each
	// payment is a row written through the execution's transaction
	// (pgstore.Tx, mysqlstore.Tx), committed with the stored response.
	ledger, closeLedger, err := openLedger(flags)
	if err != nil {
		return err
	}
	defer closeLedger()
	api := handlers{svc: newService(flags.ChargeLatency, ledger)}
	e.POST("/v1/payments", api.createPayment, authenticate, idempotent)
	e.POST("/v1/refunds", api.createRefund, authenticate, idempotent)
	e.POST("/v1/exports", api.createExport, authenticate, idempotent)
	e.GET("/v1/payments/:id", api.getPayment)
	e.GET("/v1/stats", api.stats)
	e.GET("/metrics", echo.WrapHandler(metrics))

	// Tracing outermost, so that idem finds the request's span in its context.
	return serve(flags.Addr, &http.Server{Handler: otelhttp.NewHandler(e, "payments"), ReadHeaderTimeout: 10 * time.Second}, engine, api.svc)
}

// authenticate stands in for real authentication: it trusts X-User-ID.
func authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		user := c.Request().Header.Get("X-User-ID")
		if user == "" {
			return Unauthenticated
		}
		c.Set("user_id", user)
		return next(c)
	}
}

// handlers are the payment endpoints; they know nothing about idem.
type handlers struct{ svc *Service }

func (h handlers) createPayment(c echo.Context) error {
	var req ChargeRequest
	if err := c.Bind(&req); err != nil {
		return Invalid("body must be JSON: " + err.Error())
	}
	p, err := h.svc.Charge(c.Request().Context(), c.Get("user_id").(string), req)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Location", "/v1/payments/"+p.ID)
	return c.JSON(http.StatusCreated, p)
}

func (h handlers) createRefund(c echo.Context) error {
	var req RefundRequest
	if err := c.Bind(&req); err != nil {
		return Invalid("body must be JSON: " + err.Error())
	}
	rf, err := h.svc.Refund(c.Request().Context(), c.Get("user_id").(string), req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, rf)
}

func (h handlers) createExport(c echo.Context) error {
	var req ExportRequest
	if err := c.Bind(&req); err != nil {
		return Invalid("body must be JSON: " + err.Error())
	}
	b, err := h.svc.Export(c.Request().Context(), req)
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, "application/octet-stream", b)
}

func (h handlers) getPayment(c echo.Context) error {
	if p, ok := h.svc.Payment(c.Param("id")); ok {
		return c.JSON(http.StatusOK, p)
	}
	return &Error{Status: 404, Title: "Payment not found", Detail: "no payment " + c.Param("id")}
}

func (h handlers) stats(c echo.Context) error { return c.JSON(http.StatusOK, h.svc.Stats()) }

// problem is Echo's error handler: every error becomes an RFC 9457 problem.
func problem(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var pe *Error
	var he *echo.HTTPError
	switch {
	case errors.As(err, &pe):
	case errors.As(err, &he):
		pe = &Error{Status: he.Code, Title: http.StatusText(he.Code), Detail: err.Error()}
	default:
		pe = &Error{Status: 500, Title: "Internal error", Detail: "the server failed; retry with the same Idempotency-Key"}
	}
	_ = c.Blob(pe.Status, ProblemContentType, pe.Problem())
}

// serve listens on addr, prints "listening on http://ADDR" once it accepts
// connections, and serves srv until SIGINT or SIGTERM. Then it shuts down
// gracefully: srv stops accepting and lets in-flight requests finish, then
// engine.Close waits for the completions the engine is still retrying after
// a store error, all within 10s (more than the 5s net/http waits for a
// connection that has not sent a request yet). Last it prints
// "executions N", the provider executions (tests/chaos reads both lines).
func serve(addr string, srv *http.Server, engine *idem.Engine, svc *Service) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening on http://%s\n", ln.Addr()) // after the signal handler: a SIGTERM from now on shuts down cleanly
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
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
	if err := engine.Close(shutdown); err != nil {
		slog.Warn("idem: completions still retrying were abandoned", "err", err)
	}
	fmt.Printf("executions %d\n", svc.Stats().Executions)
	return nil
}
