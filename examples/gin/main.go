// Command gin is the payments API on Gin with idem on its mutating routes.
// run below wires everything, top to bottom: the store, the engine, the
// authentication that sets the principal, the idem middleware, the routes.
// Run it with
//
//	go run ./examples/gin -store memory
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
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/idemkit/idem/adapters/idemgin"
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
	idempotent := idemgin.New(engine, idemgin.WithScope(func(c *gin.Context) string {
		return c.GetString("user_id")
	}))
	if flags.NoIdem { // the benchmarks' baseline: the same service, unprotected
		idempotent = func(c *gin.Context) { c.Next() }
	}

	// The routes: recovery and request ids outside everything (idem never
	// stores or replays what they set: a replay carries this exchange's
	// X-Request-Id), then authentication, then idem, then the handler.
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.CustomRecovery(recovered), requestID)
	// The payments ledger (store.go): with -store postgres or mysql each
	// payment is a row written through the execution's transaction
	// (pgstore.Tx, mysqlstore.Tx), committed with the stored response.
	ledger, closeLedger, err := openLedger(flags)
	if err != nil {
		return err
	}
	defer closeLedger()
	api := handlers{svc: newService(flags.ChargeLatency, ledger)}
	r.POST("/v1/payments", authenticate, idempotent, api.createPayment)
	r.POST("/v1/refunds", authenticate, idempotent, api.createRefund)
	r.POST("/v1/exports", authenticate, idempotent, api.createExport)
	r.GET("/v1/payments/:id", api.getPayment)
	r.GET("/v1/stats", api.stats)
	r.GET("/metrics", gin.WrapH(metrics))

	// Tracing outermost, so that idem finds the request's span in its context.
	return serve(flags.Addr, &http.Server{Handler: otelhttp.NewHandler(r, "payments"), ReadHeaderTimeout: 10 * time.Second}, engine, api.svc)
}

// authenticate stands in for real authentication: it trusts X-User-ID.
func authenticate(c *gin.Context) {
	user := c.GetHeader("X-User-ID")
	if user == "" {
		problem(c, Unauthenticated)
		return
	}
	c.Set("user_id", user)
}

// requestID echoes the client's X-Request-Id, or a new one, on the response
// (gin has no built-in; gin-contrib/requestid does the same).
func requestID(c *gin.Context) {
	id := c.GetHeader("X-Request-Id")
	if id == "" {
		id = rand.Text()
	}
	c.Header("X-Request-Id", id)
}

// recovered answers a panic with a 500 problem; idem has released the key.
func recovered(c *gin.Context, p any) {
	slog.Error("panic", "value", p, "path", c.Request.URL.Path)
	problem(c, &Error{Status: 500, Title: "Internal error", Detail: "the server failed; retry with the same Idempotency-Key"})
}

// handlers are the payment endpoints; they know nothing about idem.
type handlers struct{ svc *Service }

func (h handlers) createPayment(c *gin.Context) {
	var req ChargeRequest
	if err := c.ShouldBindJSON(&req); err != nil {
		problem(c, Invalid("body must be JSON: "+err.Error()))
		return
	}
	p, err := h.svc.Charge(c.Request.Context(), c.GetString("user_id"), req)
	if err != nil {
		problem(c, err)
		return
	}
	c.Header("Location", "/v1/payments/"+p.ID)
	c.JSON(http.StatusCreated, p)
}

func (h handlers) createRefund(c *gin.Context) {
	var req RefundRequest
	if err := c.ShouldBindJSON(&req); err != nil {
		problem(c, Invalid("body must be JSON: "+err.Error()))
		return
	}
	rf, err := h.svc.Refund(c.Request.Context(), c.GetString("user_id"), req)
	if err != nil {
		problem(c, err)
		return
	}
	c.JSON(http.StatusCreated, rf)
}

func (h handlers) createExport(c *gin.Context) {
	var req ExportRequest
	if err := c.ShouldBindJSON(&req); err != nil {
		problem(c, Invalid("body must be JSON: "+err.Error()))
		return
	}
	b, err := h.svc.Export(c.Request.Context(), req)
	if err != nil {
		problem(c, err)
		return
	}
	c.Data(http.StatusOK, "application/octet-stream", b)
}

func (h handlers) getPayment(c *gin.Context) {
	if p, ok := h.svc.Payment(c.Param("id")); ok {
		c.JSON(http.StatusOK, p)
		return
	}
	problem(c, &Error{Status: 404, Title: "Payment not found", Detail: "no payment " + c.Param("id")})
}

func (h handlers) stats(c *gin.Context) { c.JSON(http.StatusOK, h.svc.Stats()) }

// problem writes err as an RFC 9457 problem and stops the handler chain.
func problem(c *gin.Context, err error) {
	var pe *Error
	if !errors.As(err, &pe) {
		pe = &Error{Status: 500, Title: "Internal error", Detail: err.Error()}
	}
	c.Data(pe.Status, ProblemContentType, pe.Problem())
	c.Abort()
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
