// Command echo is the payments API on Echo v4 with idem on its mutating
// routes: authentication first (it sets the principal), then idem, then the
// handler; Echo's Recover middleware outside. Handlers return errors, which
// Echo's error handler renders as problems. Run it with
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

	"github.com/idemkit/idem/adapters/idemecho"
	"github.com/idemkit/idem/examples/internal/app"
	"github.com/idemkit/idem/examples/internal/payments"
)

func main() {
	app.Run(app.ParseFlags(), func(d app.Deps) app.Server { return app.HTTPServer(router(d)) })
}

func router(d app.Deps) *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = problem
	e.Use(middleware.Recover())
	svc := d.Payments

	writes := []echo.MiddlewareFunc{authenticate}
	if d.Engine != nil {
		writes = append(writes, idemecho.New(d.Engine, idemecho.WithScope(func(c echo.Context) string {
			s, _ := c.Get("user_id").(string)
			return s
		})))
	}
	e.POST("/v1/payments", func(c echo.Context) error {
		var req payments.ChargeRequest
		if err := c.Bind(&req); err != nil {
			return payments.Invalid("body must be JSON: " + err.Error())
		}
		p, err := svc.Charge(c.Request().Context(), c.Get("user_id").(string), req)
		if err != nil {
			return err
		}
		c.Response().Header().Set("Location", "/v1/payments/"+p.ID)
		return c.JSON(http.StatusCreated, p)
	}, writes...)
	e.POST("/v1/refunds", func(c echo.Context) error {
		var req payments.RefundRequest
		if err := c.Bind(&req); err != nil {
			return payments.Invalid("body must be JSON: " + err.Error())
		}
		rf, err := svc.Refund(c.Request().Context(), c.Get("user_id").(string), req)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, rf)
	}, writes...)
	e.POST("/v1/exports", func(c echo.Context) error {
		var req payments.ExportRequest
		if err := c.Bind(&req); err != nil {
			return payments.Invalid("body must be JSON: " + err.Error())
		}
		b, err := svc.Export(c.Request().Context(), req)
		if err != nil {
			return err
		}
		return c.Blob(http.StatusOK, "application/octet-stream", b)
	}, writes...)

	e.GET("/v1/payments/:id", func(c echo.Context) error {
		if p, ok := svc.Payment(c.Param("id")); ok {
			return c.JSON(http.StatusOK, p)
		}
		return &payments.Error{Status: 404, Title: "Payment not found", Detail: "no payment " + c.Param("id")}
	})
	e.GET("/v1/stats", func(c echo.Context) error { return c.JSON(http.StatusOK, svc.Stats()) })
	return e
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
