package main

import (
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/idemkit/idem/adapters/idemecho"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/payments"
)

// echoServer serves app's routes on Echo v4: recovery and request ids
// outside everything, then authentication, then idem, then the route (Echo
// runs route middleware in the order given); errors become problems in
// Echo's error handler; tracing outermost.
func echoServer(app *payments.App) (payments.Server, error) {
	idempotent := idemecho.New(app.Engine, idemecho.WithScope(func(c echo.Context) string {
		s, _ := c.Get("user_id").(string)
		return s
	}))
	if app.Config.NoIdem {
		idempotent = func(next echo.HandlerFunc) echo.HandlerFunc { return next }
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = echoProblem
	e.Use(middleware.Recover(), middleware.RequestID())
	for _, rt := range payments.Routes(app.Service) {
		var mw []echo.MiddlewareFunc
		if rt.Protected {
			mw = []echo.MiddlewareFunc{echoAuthenticate(app), idempotent}
		}
		e.Add(rt.Method, payments.ColonPath(rt.Path), echoRoute(rt), mw...)
	}
	e.GET("/metrics", echo.WrapHandler(app.Metrics))
	if err := app.Recover(idem.HTTPRunner(e)); err != nil {
		return nil, err
	}
	return &http.Server{Handler: otelhttp.NewHandler(e, "payments"), ReadHeaderTimeout: 10 * time.Second}, nil
}

// echoRoute adapts rt to Echo v4.
func echoRoute(rt payments.Route) echo.HandlerFunc {
	name := rt.Param()
	return func(c echo.Context) error {
		body, err := io.ReadAll(c.Request().Body)
		if err != nil {
			return payments.Invalid("reading the body: " + err.Error())
		}
		user, _ := c.Get("user_id").(string)
		res := rt.Handle(c.Request().Context(), payments.Request{User: user, Param: c.Param(name), Body: body})
		if res.Location != "" {
			c.Response().Header().Set("Location", res.Location)
		}
		return c.Blob(res.Status, res.ContentType, res.Body)
	}
}

// echoAuthenticate stands in for real authentication: it trusts X-User-ID,
// or re-establishes a recovery run's stored principal (app.User).
func echoAuthenticate(app *payments.App) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			user := app.User(c.Request().Header.Get(idem.RecoveryHeader), c.Request().Header.Get("X-User-ID"))
			if user == "" {
				return payments.Unauthenticated
			}
			c.Set("user_id", user)
			return next(c)
		}
	}
}

// echoProblem is Echo's error handler: every error becomes an RFC 9457
// problem.
func echoProblem(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var he *echo.HTTPError
	if errors.As(err, &he) && !errors.As(err, new(*payments.Error)) {
		err = &payments.Error{Status: he.Code, Title: http.StatusText(he.Code), Detail: err.Error()}
	}
	res := payments.ProblemResponse(err)
	_ = c.Blob(res.Status, res.ContentType, res.Body)
}
