// Command fiber is the payments API on Fiber v2 with idem on its mutating
// routes. run below wires everything, top to bottom: the store, the engine,
// the authentication that sets the principal, the idem middleware, the
// routes. Handlers return errors, which the app's error handler renders as
// problems. Run it with
//
//	go run ./examples/fiber -store memory
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
	"strings"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/gofiber/fiber/v2/middleware/requestid"

	"github.com/idemkit/idem/adapters/idemfiber"
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
	// (Prometheus text). idemotel turns the engine's events into metrics
	// (Fiber is not net/http: no tracing middleware here).
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
	idempotent := idemfiber.New(engine, idemfiber.WithScope(func(c *fiber.Ctx) string {
		s, _ := c.Locals("user_id").(string)
		return s
	}))
	if flags.NoIdem { // the benchmarks' baseline: the same service, unprotected
		idempotent = func(c *fiber.Ctx) error { return c.Next() }
	}

	// The routes: recovery and request ids outside everything (idem never
	// stores or replays what they set: a replay carries this exchange's
	// X-Request-Id), then authentication, then idem, then the handler. idemfiber is mounted on each route: its route
	// scope is the route it is mounted on.
	a := fiber.New(fiber.Config{DisableStartupMessage: true, ErrorHandler: problem})
	a.Use(recover.New(), requestid.New())
	// The payments ledger (store.go): with -store postgres or mysql each
	// payment is a row written through the execution's transaction
	// (pgstore.Tx, mysqlstore.Tx), committed with the stored response.
	ledger, closeLedger, err := openLedger(flags)
	if err != nil {
		return err
	}
	defer closeLedger()
	api := handlers{svc: newService(flags.ChargeLatency, ledger)}
	a.Post("/v1/payments", authenticate, idempotent, api.createPayment)
	a.Post("/v1/refunds", authenticate, idempotent, api.createRefund)
	a.Post("/v1/exports", authenticate, idempotent, api.createExport)
	a.Get("/v1/payments/:id", api.getPayment)
	a.Get("/v1/stats", api.stats)
	a.Get("/metrics", adaptor.HTTPHandler(metrics))

	return serve(flags.Addr, a, engine, api.svc)
}

// authenticate stands in for real authentication: it trusts X-User-ID.
func authenticate(c *fiber.Ctx) error {
	user := c.Get("X-User-ID")
	if user == "" {
		return Unauthenticated
	}
	c.Locals("user_id", strings.Clone(user)) // c.Get aliases a buffer fasthttp reuses for the next request
	return c.Next()
}

// handlers are the payment endpoints; they know nothing about idem.
type handlers struct{ svc *Service }

func (h handlers) createPayment(c *fiber.Ctx) error {
	var req ChargeRequest
	if err := c.BodyParser(&req); err != nil {
		return Invalid("body must be JSON: " + err.Error())
	}
	p, err := h.svc.Charge(c.UserContext(), c.Locals("user_id").(string), req)
	if err != nil {
		return err
	}
	c.Location("/v1/payments/" + p.ID)
	return c.Status(http.StatusCreated).JSON(p)
}

func (h handlers) createRefund(c *fiber.Ctx) error {
	var req RefundRequest
	if err := c.BodyParser(&req); err != nil {
		return Invalid("body must be JSON: " + err.Error())
	}
	rf, err := h.svc.Refund(c.UserContext(), c.Locals("user_id").(string), req)
	if err != nil {
		return err
	}
	return c.Status(http.StatusCreated).JSON(rf)
}

func (h handlers) createExport(c *fiber.Ctx) error {
	var req ExportRequest
	if err := c.BodyParser(&req); err != nil {
		return Invalid("body must be JSON: " + err.Error())
	}
	b, err := h.svc.Export(c.UserContext(), req)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderContentType, "application/octet-stream")
	return c.Send(b)
}

func (h handlers) getPayment(c *fiber.Ctx) error {
	if p, ok := h.svc.Payment(c.Params("id")); ok {
		return c.JSON(p)
	}
	return &Error{Status: 404, Title: "Payment not found", Detail: "no payment " + c.Params("id")}
}

func (h handlers) stats(c *fiber.Ctx) error { return c.JSON(h.svc.Stats()) }

// problem is the app's error handler: every error becomes an RFC 9457 problem.
func problem(c *fiber.Ctx, err error) error {
	var pe *Error
	var fe *fiber.Error
	switch {
	case errors.As(err, &pe):
	case errors.As(err, &fe):
		pe = &Error{Status: fe.Code, Title: http.StatusText(fe.Code), Detail: fe.Message}
	default:
		pe = &Error{Status: 500, Title: "Internal error", Detail: "the server failed; retry with the same Idempotency-Key"}
	}
	c.Set(fiber.HeaderContentType, ProblemContentType)
	return c.Status(pe.Status).Send(pe.Problem())
}

// serve listens on addr, prints "listening on http://ADDR" once it accepts
// connections, and serves srv until SIGINT or SIGTERM. Then it shuts down
// gracefully: srv stops accepting and lets in-flight requests finish, then
// engine.Close waits for the completions the engine is still retrying after
// a store error, all within 10s. Last it prints
// "executions N", the provider executions (tests/chaos reads both lines).
func serve(addr string, srv *fiber.App, engine *idem.Engine, svc *Service) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening on http://%s\n", ln.Addr()) // after the signal handler: a SIGTERM from now on shuts down cleanly
	errc := make(chan error, 1)
	go func() { errc <- srv.Listener(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.ShutdownWithContext(shutdown); err != nil {
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
