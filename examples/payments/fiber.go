package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/gofiber/fiber/v2/middleware/requestid"

	"github.com/idemkit/idem/adapters/idemfiber"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/payments"
)

// fiberServer serves app's routes on Fiber v2: recovery and request ids
// outside everything, then authentication, then idem (mounted on each
// route: its route scope is the route it is mounted on), then the route;
// errors become problems in the app's error handler. Fiber is not
// net/http: no tracing middleware here.
func fiberServer(app *payments.App) (payments.Server, error) {
	idempotent := idemfiber.New(app.Engine, idemfiber.WithScope(func(c *fiber.Ctx) string {
		s, _ := c.Locals("user_id").(string)
		return s
	}))
	if app.Config.NoIdem {
		idempotent = func(c *fiber.Ctx) error { return c.Next() }
	}
	a := fiber.New(fiber.Config{DisableStartupMessage: true, ErrorHandler: fiberProblem})
	a.Use(recover.New(), requestid.New())
	for _, rt := range payments.Routes(app.Service) {
		handlers := []fiber.Handler{fiberRoute(rt)}
		if rt.Protected {
			handlers = []fiber.Handler{fiberAuthenticate(app), idempotent, fiberRoute(rt)}
		}
		a.Add(rt.Method, payments.ColonPath(rt.Path), handlers...)
	}
	a.Get("/metrics", adaptor.HTTPHandler(app.Metrics))
	if err := app.Recover(idemfiber.Runner(a)); err != nil {
		return nil, err
	}
	return fiberApp{a}, nil
}

// fiberApp is a Fiber v2 app as a payments.Server.
type fiberApp struct{ *fiber.App }

func (a fiberApp) Serve(ln net.Listener) error        { return a.Listener(ln) }
func (a fiberApp) Shutdown(ctx context.Context) error { return a.ShutdownWithContext(ctx) }

// fiberRoute adapts rt to Fiber v2.
func fiberRoute(rt payments.Route) fiber.Handler {
	name := rt.Param()
	return func(c *fiber.Ctx) error {
		user, _ := c.Locals("user_id").(string)
		// c.Body and c.Params alias buffers fasthttp reuses for the next request.
		res := rt.Handle(c.UserContext(), payments.Request{User: user, Param: strings.Clone(c.Params(name)), Body: c.Body()})
		if res.Location != "" {
			c.Location(res.Location)
		}
		c.Set(fiber.HeaderContentType, res.ContentType)
		return c.Status(res.Status).Send(res.Body)
	}
}

// fiberAuthenticate stands in for real authentication: it trusts X-User-ID,
// or re-establishes a recovery run's stored principal (app.User).
func fiberAuthenticate(app *payments.App) fiber.Handler {
	return func(c *fiber.Ctx) error {
		user := app.User(c.Get(idem.RecoveryHeader), c.Get("X-User-ID"))
		if user == "" {
			return payments.Unauthenticated
		}
		c.Locals("user_id", strings.Clone(user)) // c.Get aliases a buffer fasthttp reuses for the next request
		return c.Next()
	}
}

// fiberProblem is the app's error handler: every error becomes an RFC 9457
// problem.
func fiberProblem(c *fiber.Ctx, err error) error {
	var fe *fiber.Error
	if errors.As(err, &fe) {
		err = &payments.Error{Status: fe.Code, Title: http.StatusText(fe.Code), Detail: fe.Message}
	}
	res := payments.ProblemResponse(err)
	c.Set(fiber.HeaderContentType, res.ContentType)
	return c.Status(res.Status).Send(res.Body)
}
