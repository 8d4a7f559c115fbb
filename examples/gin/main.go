// Command gin is the payments API on Gin with idem on its mutating routes:
// authentication first (it sets the principal), then idem, then the handler;
// gin's recovery outside both. Run it with
//
//	go run ./examples/gin -store memory
//
// and see README.md for the HTTP contract every example serves.
package main

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/adapters/idemgin"
	"github.com/idemkit/idem/examples/internal/app"
	"github.com/idemkit/idem/examples/internal/payments"
)

func main() {
	app.Run(app.ParseFlags(), func(d app.Deps) app.Server { return app.HTTPServer(router(d)) })
}

func router(d app.Deps) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.CustomRecovery(func(c *gin.Context, p any) {
		slog.Error("panic", "value", p, "path", c.Request.URL.Path)
		problem(c, &payments.Error{Status: 500, Title: "Internal error", Detail: "the server failed; retry with the same Idempotency-Key"})
	}))
	svc := d.Payments

	writes := r.Group("/v1", authenticate)
	if d.Engine != nil {
		writes.Use(idemgin.New(d.Engine, idemgin.WithScope(func(c *gin.Context) string { return c.GetString("user_id") })))
	}
	writes.POST("/payments", func(c *gin.Context) {
		var req payments.ChargeRequest
		if err := c.ShouldBindJSON(&req); err != nil {
			problem(c, payments.Invalid("body must be JSON: "+err.Error()))
			return
		}
		p, err := svc.Charge(c.Request.Context(), c.GetString("user_id"), req)
		if err != nil {
			problem(c, err)
			return
		}
		c.Header("Location", "/v1/payments/"+p.ID)
		c.JSON(http.StatusCreated, p)
	})
	writes.POST("/refunds", func(c *gin.Context) {
		var req payments.RefundRequest
		if err := c.ShouldBindJSON(&req); err != nil {
			problem(c, payments.Invalid("body must be JSON: "+err.Error()))
			return
		}
		rf, err := svc.Refund(c.Request.Context(), c.GetString("user_id"), req)
		if err != nil {
			problem(c, err)
			return
		}
		c.JSON(http.StatusCreated, rf)
	})
	writes.POST("/exports", func(c *gin.Context) {
		var req payments.ExportRequest
		if err := c.ShouldBindJSON(&req); err != nil {
			problem(c, payments.Invalid("body must be JSON: "+err.Error()))
			return
		}
		b, err := svc.Export(c.Request.Context(), req)
		if err != nil {
			problem(c, err)
			return
		}
		c.Data(http.StatusOK, "application/octet-stream", b)
	})

	r.GET("/v1/payments/:id", func(c *gin.Context) {
		if p, ok := svc.Payment(c.Param("id")); ok {
			c.JSON(http.StatusOK, p)
			return
		}
		problem(c, &payments.Error{Status: 404, Title: "Payment not found", Detail: "no payment " + c.Param("id")})
	})
	r.GET("/v1/stats", func(c *gin.Context) { c.JSON(http.StatusOK, svc.Stats()) })
	return r
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

func problem(c *gin.Context, err error) {
	var pe *payments.Error
	if !errors.As(err, &pe) {
		pe = &payments.Error{Status: 500, Title: "Internal error", Detail: err.Error()}
	}
	c.Data(pe.Status, payments.ProblemContentType, pe.Problem())
	c.Abort()
}
