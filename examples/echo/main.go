// Command echo is the payments API on Echo v4 with idem on its mutating
// routes. run below wires everything, top to bottom: the store, the engine,
// the authentication that sets the principal, the idem middleware, the
// routes. Handlers return errors, which Echo's error handler renders as
// problems. Run it with
//
//	go run ./examples/echo -store memory
//
// and see README.md for the HTTP contract every example serves.
package main

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/idemkit/idem/adapters/idemecho"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/app"
	"github.com/idemkit/idem/examples/internal/payments"
	"github.com/idemkit/idem/observability/idemotel"
)

func main() { app.Exit(run(app.ParseFlags())) }

func run(flags app.Flags) error {
	// The store: memory (one process), Redis, MongoDB or PostgreSQL (several instances).
	store, closeStore, err := app.OpenStore(flags)
	if err != nil {
		return err
	}
	defer closeStore()

	// Telemetry: OpenTelemetry metrics served on GET /metrics (Prometheus
	// text), spans to -trace-file. idemotel turns the engine's events into metrics and span attributes.
	metrics, stopTelemetry, err := app.Telemetry(flags)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	telemetry, err := idemotel.NewEventHook()
	if err != nil {
		return err
	}

	// The engine: the rules every protected route shares.
	engine, err := idem.New(store,
		idem.WithRetention(flags.TTL),
		idem.WithLease(flags.Lease),
		idem.WithStoreTimeout(flags.StoreTimeout),
		idem.WithEventHook(telemetry),
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
	// The payments ledger: rows in PostgreSQL with -store postgres (through
	// the execution's transaction) or -payments-postgres, else none.
	ledger, closeLedger, err := app.OpenLedger(flags)
	if err != nil {
		return err
	}
	defer closeLedger()
	api := handlers{svc: payments.New(flags.ChargeLatency, ledger)}
	e.POST("/v1/payments", api.createPayment, authenticate, idempotent)
	e.POST("/v1/refunds", api.createRefund, authenticate, idempotent)
	e.POST("/v1/exports", api.createExport, authenticate, idempotent)
	e.GET("/v1/payments/:id", api.getPayment)
	e.GET("/v1/stats", api.stats)
	e.GET("/metrics", echo.WrapHandler(metrics))

	// Tracing outermost, so that idem finds the request's span in its context.
	return app.Serve(flags.Addr, app.HTTPServer(otelhttp.NewHandler(e, "payments")), engine, api.svc)
}

// authenticate stands in for real authentication: it trusts X-User-ID.
func authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		user := c.Request().Header.Get("X-User-ID")
		if user == "" {
			return payments.Unauthenticated
		}
		c.Set("user_id", user)
		return next(c)
	}
}

// handlers are the payment endpoints; they know nothing about idem.
type handlers struct{ svc *payments.Service }

func (h handlers) createPayment(c echo.Context) error {
	var req payments.ChargeRequest
	if err := c.Bind(&req); err != nil {
		return payments.Invalid("body must be JSON: " + err.Error())
	}
	p, err := h.svc.Charge(c.Request().Context(), c.Get("user_id").(string), req)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Location", "/v1/payments/"+p.ID)
	return c.JSON(http.StatusCreated, p)
}

func (h handlers) createRefund(c echo.Context) error {
	var req payments.RefundRequest
	if err := c.Bind(&req); err != nil {
		return payments.Invalid("body must be JSON: " + err.Error())
	}
	rf, err := h.svc.Refund(c.Request().Context(), c.Get("user_id").(string), req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, rf)
}

func (h handlers) createExport(c echo.Context) error {
	var req payments.ExportRequest
	if err := c.Bind(&req); err != nil {
		return payments.Invalid("body must be JSON: " + err.Error())
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
	return &payments.Error{Status: 404, Title: "Payment not found", Detail: "no payment " + c.Param("id")}
}

func (h handlers) stats(c echo.Context) error { return c.JSON(http.StatusOK, h.svc.Stats()) }

// problem is Echo's error handler: every error becomes an RFC 9457 problem.
func problem(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var pe *payments.Error
	var he *echo.HTTPError
	switch {
	case errors.As(err, &pe):
	case errors.As(err, &he):
		pe = &payments.Error{Status: he.Code, Title: http.StatusText(he.Code), Detail: err.Error()}
	default:
		pe = &payments.Error{Status: 500, Title: "Internal error", Detail: "the server failed; retry with the same Idempotency-Key"}
	}
	_ = c.Blob(pe.Status, payments.ProblemContentType, pe.Problem())
}
