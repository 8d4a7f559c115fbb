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
	"github.com/idemkit/idem/examples/internal/payments"
)

// fiberv3Server serves app's routes on Fiber v3, wired as fiberServer.
func fiberv3Server(app *payments.App) (payments.Server, error) {
	idempotent := idemfiberv3.New(app.Engine, idemfiberv3.WithScope(func(c fiber.Ctx) string {
		return fiber.Locals[string](c, "user_id")
	}))
	if app.Config.NoIdem {
		idempotent = func(c fiber.Ctx) error { return c.Next() }
	}
	a := fiber.New(fiber.Config{ErrorHandler: fiberv3Problem})
	a.Use(recover.New(), requestid.New())
	for _, rt := range payments.Routes(app.Service) {
		if rt.Protected {
			a.Add([]string{rt.Method}, payments.ColonPath(rt.Path), fiberv3Authenticate(app), idempotent, fiberv3Route(rt))
		} else {
			a.Add([]string{rt.Method}, payments.ColonPath(rt.Path), fiberv3Route(rt))
		}
	}
	a.Get("/metrics", adaptor.HTTPHandler(app.Metrics))
	if err := app.Recover(idemfiberv3.Runner(a)); err != nil {
		return nil, err
	}
	return fiberv3App{a}, nil
}

// fiberv3App is a Fiber v3 app as a payments.Server.
type fiberv3App struct{ *fiber.App }

func (a fiberv3App) Serve(ln net.Listener) error {
	return a.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true})
}
func (a fiberv3App) Shutdown(ctx context.Context) error { return a.ShutdownWithContext(ctx) }

// fiberv3Route adapts rt to Fiber v3.
func fiberv3Route(rt payments.Route) fiber.Handler {
	name := rt.Param()
	return func(c fiber.Ctx) error {
		// c.Params aliases a buffer fasthttp reuses for the next request;
		// the Ctx is the request's context.Context.
		res := rt.Handle(c, payments.Request{User: fiber.Locals[string](c, "user_id"), Param: strings.Clone(c.Params(name)), Body: c.Body()})
		if res.Location != "" {
			c.Location(res.Location)
		}
		c.Set(fiber.HeaderContentType, res.ContentType)
		return c.Status(res.Status).Send(res.Body)
	}
}

// fiberv3Authenticate stands in for real authentication: it trusts X-User-ID,
// or re-establishes a recovery run's stored principal (app.User).
func fiberv3Authenticate(app *payments.App) fiber.Handler {
	return func(c fiber.Ctx) error {
		user := app.User(c.Get(idem.RecoveryHeader), c.Get("X-User-ID"))
		if user == "" {
			return payments.Unauthenticated
		}
		fiber.Locals(c, "user_id", strings.Clone(user)) // c.Get aliases a buffer fasthttp reuses for the next request
		return c.Next()
	}
}

// fiberv3Problem is the app's error handler: every error becomes an RFC 9457
// problem.
func fiberv3Problem(c fiber.Ctx, err error) error {
	var fe *fiber.Error
	if errors.As(err, &fe) {
		err = &payments.Error{Status: fe.Code, Title: http.StatusText(fe.Code), Detail: fe.Message}
	}
	res := payments.ProblemResponse(err)
	c.Set(fiber.HeaderContentType, res.ContentType)
	return c.Status(res.Status).Send(res.Body)
}
