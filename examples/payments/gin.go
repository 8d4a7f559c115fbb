package main

import (
	"crypto/rand"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/idemkit/idem/adapters/idemgin"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/payments"
)

// ginServer serves app's routes on Gin: recovery and request ids outside
// everything, then authentication, then idem, then the route; tracing
// outermost.
func ginServer(app *payments.App) (payments.Server, error) {
	idempotent := idemgin.New(app.Engine, idemgin.WithScope(func(c *gin.Context) string {
		return c.GetString("user_id")
	}))
	if app.Config.NoIdem {
		idempotent = func(c *gin.Context) { c.Next() }
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.CustomRecovery(func(c *gin.Context, p any) {
		slog.Error("panic", "value", p, "path", c.Request.URL.Path)
		writeGin(c, payments.ProblemResponse(payments.InternalError))
	}), ginRequestID)
	for _, rt := range payments.Routes(app.Service) {
		handlers := []gin.HandlerFunc{ginRoute(rt)}
		if rt.Protected {
			handlers = []gin.HandlerFunc{ginAuthenticate(app), idempotent, ginRoute(rt)}
		}
		r.Handle(rt.Method, payments.ColonPath(rt.Path), handlers...)
	}
	r.GET("/metrics", gin.WrapH(app.Metrics))
	if err := app.Recover(idem.HTTPRunner(r)); err != nil {
		return nil, err
	}
	return &http.Server{Handler: otelhttp.NewHandler(r, "payments"), ReadHeaderTimeout: 10 * time.Second}, nil
}

// ginRoute adapts rt to Gin.
func ginRoute(rt payments.Route) gin.HandlerFunc {
	name := rt.Param()
	return func(c *gin.Context) {
		body, err := c.GetRawData()
		if err != nil {
			writeGin(c, payments.ProblemResponse(payments.Invalid("reading the body: "+err.Error())))
			return
		}
		writeGin(c, rt.Handle(c.Request.Context(), payments.Request{User: c.GetString("user_id"), Param: c.Param(name), Body: body}))
	}
}

// writeGin writes res and stops the handler chain.
func writeGin(c *gin.Context, res payments.Response) {
	if res.Location != "" {
		c.Header("Location", res.Location)
	}
	c.Data(res.Status, res.ContentType, res.Body)
	c.Abort()
}

// ginAuthenticate stands in for real authentication: it trusts X-User-ID,
// or re-establishes a recovery run's stored principal (app.User).
func ginAuthenticate(app *payments.App) gin.HandlerFunc {
	return func(c *gin.Context) {
		user := app.User(c.GetHeader(idem.RecoveryHeader), c.GetHeader("X-User-ID"))
		if user == "" {
			writeGin(c, payments.ProblemResponse(payments.Unauthenticated))
			return
		}
		c.Set("user_id", user)
	}
}

// ginRequestID echoes the client's X-Request-Id, or a new one, on the
// response (gin has no built-in; gin-contrib/requestid does the same).
func ginRequestID(c *gin.Context) {
	id := c.GetHeader("X-Request-Id")
	if id == "" {
		id = rand.Text()
	}
	c.Header("X-Request-Id", id)
}
