// Command gin is the payments API on Gin with idem on its mutating routes.
// run below wires everything, top to bottom: the store, the engine, the
// authentication that sets the principal, the idem middleware, the routes.
// Run it with
//
//	go run ./examples/gin -store memory
//
// and see README.md for the HTTP contract every example serves.
package main

import (
	"crypto/rand"
	"errors"
	"log/slog"
	"net/http"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/idemkit/idem/adapters/idemgin"
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
	// The payments ledger: rows in PostgreSQL with -store postgres (through
	// the execution's transaction) or -payments-postgres, else none.
	ledger, closeLedger, err := app.OpenLedger(flags)
	if err != nil {
		return err
	}
	defer closeLedger()
	api := handlers{svc: payments.New(flags.ChargeLatency, ledger)}
	r.POST("/v1/payments", authenticate, idempotent, api.createPayment)
	r.POST("/v1/refunds", authenticate, idempotent, api.createRefund)
	r.POST("/v1/exports", authenticate, idempotent, api.createExport)
	r.GET("/v1/payments/:id", api.getPayment)
	r.GET("/v1/stats", api.stats)
	r.GET("/metrics", gin.WrapH(metrics))

	// Tracing outermost, so that idem finds the request's span in its context.
	return app.Serve(flags.Addr, app.HTTPServer(otelhttp.NewHandler(r, "payments")), engine, api.svc)
}

// authenticate stands in for real authentication: it trusts X-User-ID.
func authenticate(c *gin.Context) {
	user := c.GetHeader("X-User-ID")
	if user == "" {
		problem(c, payments.Unauthenticated)
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
	problem(c, &payments.Error{Status: 500, Title: "Internal error", Detail: "the server failed; retry with the same Idempotency-Key"})
}

// handlers are the payment endpoints; they know nothing about idem.
type handlers struct{ svc *payments.Service }

func (h handlers) createPayment(c *gin.Context) {
	var req payments.ChargeRequest
	if err := c.ShouldBindJSON(&req); err != nil {
		problem(c, payments.Invalid("body must be JSON: "+err.Error()))
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
	var req payments.RefundRequest
	if err := c.ShouldBindJSON(&req); err != nil {
		problem(c, payments.Invalid("body must be JSON: "+err.Error()))
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
	var req payments.ExportRequest
	if err := c.ShouldBindJSON(&req); err != nil {
		problem(c, payments.Invalid("body must be JSON: "+err.Error()))
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
	problem(c, &payments.Error{Status: 404, Title: "Payment not found", Detail: "no payment " + c.Param("id")})
}

func (h handlers) stats(c *gin.Context) { c.JSON(http.StatusOK, h.svc.Stats()) }

// problem writes err as an RFC 9457 problem and stops the handler chain.
func problem(c *gin.Context, err error) {
	var pe *payments.Error
	if !errors.As(err, &pe) {
		pe = &payments.Error{Status: 500, Title: "Internal error", Detail: err.Error()}
	}
	c.Data(pe.Status, payments.ProblemContentType, pe.Problem())
	c.Abort()
}
