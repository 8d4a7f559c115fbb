// Command fiberv3 is the payments API on Fiber v3 with idem on its mutating
// routes. run below wires everything, top to bottom: the store, the engine,
// the authentication that sets the principal, the idem middleware, the
// routes. Handlers return errors, which the app's error handler renders as
// problems. Run it with
//
//	go run ./examples/fiberv3 -store memory
//
// and see README.md for the HTTP contract every example serves.
package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/adaptor"
	"github.com/gofiber/fiber/v3/middleware/recover"
	"github.com/gofiber/fiber/v3/middleware/requestid"

	"github.com/idemkit/idem/adapters/idemfiberv3"
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
	// text). idemotel turns the engine's events into metrics (Fiber is not net/http: no tracing middleware here).
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
	idempotent := idemfiberv3.New(engine, idemfiberv3.WithScope(func(c fiber.Ctx) string {
		return fiber.Locals[string](c, "user_id")
	}))
	if flags.NoIdem { // the benchmarks' baseline: the same service, unprotected
		idempotent = func(c fiber.Ctx) error { return c.Next() }
	}

	// The routes: recovery and request ids outside everything (idem never
	// stores or replays what they set: a replay carries this exchange's
	// X-Request-Id), then authentication, then idem, then the handler. idemfiberv3 is mounted on each route: its
	// route scope is the route it is mounted on.
	a := fiber.New(fiber.Config{ErrorHandler: problem})
	a.Use(recover.New(), requestid.New())
	// The payments ledger: rows in PostgreSQL with -store postgres (through
	// the execution's transaction) or -payments-postgres, else none.
	ledger, closeLedger, err := app.OpenLedger(flags)
	if err != nil {
		return err
	}
	defer closeLedger()
	api := handlers{svc: payments.New(flags.ChargeLatency, ledger)}
	a.Post("/v1/payments", authenticate, idempotent, api.createPayment)
	a.Post("/v1/refunds", authenticate, idempotent, api.createRefund)
	a.Post("/v1/exports", authenticate, idempotent, api.createExport)
	a.Get("/v1/payments/:id", api.getPayment)
	a.Get("/v1/stats", api.stats)
	a.Get("/metrics", adaptor.HTTPHandler(metrics))

	return app.Serve(flags.Addr, server{a}, engine, api.svc)
}

// server adapts *fiber.App to app.Server.
type server struct{ *fiber.App }

func (s server) Serve(ln net.Listener) error {
	return s.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true})
}
func (s server) Shutdown(ctx context.Context) error { return s.ShutdownWithContext(ctx) }

// authenticate stands in for real authentication: it trusts X-User-ID.
func authenticate(c fiber.Ctx) error {
	user := c.Get("X-User-ID")
	if user == "" {
		return payments.Unauthenticated
	}
	fiber.Locals(c, "user_id", strings.Clone(user)) // c.Get aliases a buffer fasthttp reuses for the next request
	return c.Next()
}

// handlers are the payment endpoints; they know nothing about idem. In Fiber
// v3 the Ctx is the request's context.Context.
type handlers struct{ svc *payments.Service }

func (h handlers) createPayment(c fiber.Ctx) error {
	var req payments.ChargeRequest
	if err := c.Bind().Body(&req); err != nil {
		return payments.Invalid("body must be JSON: " + err.Error())
	}
	p, err := h.svc.Charge(c, fiber.Locals[string](c, "user_id"), req)
	if err != nil {
		return err
	}
	c.Location("/v1/payments/" + p.ID)
	return c.Status(http.StatusCreated).JSON(p)
}

func (h handlers) createRefund(c fiber.Ctx) error {
	var req payments.RefundRequest
	if err := c.Bind().Body(&req); err != nil {
		return payments.Invalid("body must be JSON: " + err.Error())
	}
	rf, err := h.svc.Refund(c, fiber.Locals[string](c, "user_id"), req)
	if err != nil {
		return err
	}
	return c.Status(http.StatusCreated).JSON(rf)
}

func (h handlers) createExport(c fiber.Ctx) error {
	var req payments.ExportRequest
	if err := c.Bind().Body(&req); err != nil {
		return payments.Invalid("body must be JSON: " + err.Error())
	}
	b, err := h.svc.Export(c, req)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderContentType, "application/octet-stream")
	return c.Send(b)
}

func (h handlers) getPayment(c fiber.Ctx) error {
	if p, ok := h.svc.Payment(c.Params("id")); ok {
		return c.JSON(p)
	}
	return &payments.Error{Status: 404, Title: "Payment not found", Detail: "no payment " + c.Params("id")}
}

func (h handlers) stats(c fiber.Ctx) error { return c.JSON(h.svc.Stats()) }

// problem is the app's error handler: every error becomes an RFC 9457 problem.
func problem(c fiber.Ctx, err error) error {
	var pe *payments.Error
	var fe *fiber.Error
	switch {
	case errors.As(err, &pe):
	case errors.As(err, &fe):
		pe = &payments.Error{Status: fe.Code, Title: http.StatusText(fe.Code), Detail: fe.Message}
	default:
		pe = &payments.Error{Status: 500, Title: "Internal error", Detail: "the server failed; retry with the same Idempotency-Key"}
	}
	c.Set(fiber.HeaderContentType, payments.ProblemContentType)
	return c.Status(pe.Status).Send(pe.Problem())
}
