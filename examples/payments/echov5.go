package main

import (
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/idemkit/idem/adapters/idemechov5"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/payments"
)

// echov5Server serves app's routes on Echo v5, wired as echoServer.
func echov5Server(app *payments.App) (payments.Server, error) {
	idempotent := idemechov5.New(app.Engine, idemechov5.WithScope(func(c *echo.Context) string {
		s, _ := echo.ContextGet[string](c, "user_id")
		return s
	}))
	if app.Config.NoIdem {
		idempotent = func(next echo.HandlerFunc) echo.HandlerFunc { return next }
	}
	e := echo.New()
	e.HTTPErrorHandler = echov5Problem
	e.Use(middleware.Recover(), middleware.RequestID())
	for _, rt := range payments.Routes(app.Service) {
		var mw []echo.MiddlewareFunc
		if rt.Protected {
			mw = []echo.MiddlewareFunc{echov5Authenticate(app), idempotent}
		}
		e.Add(rt.Method, payments.ColonPath(rt.Path), echov5Route(rt), mw...)
	}
	e.GET("/metrics", echo.WrapHandler(app.Metrics))
	if err := app.Recover(idem.HTTPRunner(e)); err != nil {
		return nil, err
	}
	return &http.Server{Handler: otelhttp.NewHandler(e, "payments"), ReadHeaderTimeout: 10 * time.Second}, nil
}

// echov5Route adapts rt to Echo v5.
func echov5Route(rt payments.Route) echo.HandlerFunc {
	name := rt.Param()
	return func(c *echo.Context) error {
		body, err := io.ReadAll(c.Request().Body)
		if err != nil {
			return payments.Invalid("reading the body: " + err.Error())
		}
		user, _ := echo.ContextGet[string](c, "user_id")
		res := rt.Handle(c.Request().Context(), payments.Request{User: user, Param: c.Param(name), Body: body})
		if res.Location != "" {
			c.Response().Header().Set("Location", res.Location)
		}
		return c.Blob(res.Status, res.ContentType, res.Body)
	}
}

// echov5Authenticate stands in for real authentication: it trusts X-User-ID,
// or re-establishes a recovery run's stored principal (app.User).
func echov5Authenticate(app *payments.App) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			user := app.User(c.Request().Header.Get(idem.RecoveryHeader), c.Request().Header.Get("X-User-ID"))
			if user == "" {
				return payments.Unauthenticated
			}
			c.Set("user_id", user)
			return next(c)
		}
	}
}

// echov5Problem is Echo's error handler: every error becomes an RFC 9457
// problem. In v5 the committed flag is on the *echo.Response beneath
// c.Response(), and echo.StatusCode reads the status of echo.ErrNotFound
// and the other predefined errors, which are no longer *echo.HTTPError.
func echov5Problem(c *echo.Context, err error) {
	if r, _ := echo.UnwrapResponse(c.Response()); r != nil && r.Committed {
		return
	}
	if code := echo.StatusCode(err); code != 0 && !errors.As(err, new(*payments.Error)) {
		err = &payments.Error{Status: code, Title: http.StatusText(code), Detail: err.Error()}
	}
	res := payments.ProblemResponse(err)
	_ = c.Blob(res.Status, res.ContentType, res.Body)
}
