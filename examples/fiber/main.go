// Command fiber is the payments API on Fiber v2 with idem on its mutating
// routes: authentication first (it sets the principal), then idem, then the
// handler; Fiber's recover middleware outside. Handlers return errors, which
// the app's error handler renders as problems. Run it with
//
//	go run ./examples/fiber -store memory
//
// and see README.md for the HTTP contract every example serves.
package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"

	"github.com/idemkit/idem/adapters/idemfiber"
	"github.com/idemkit/idem/examples/internal/app"
	"github.com/idemkit/idem/examples/internal/payments"
)

func main() { app.Run(app.ParseFlags(), func(d app.Deps) app.Server { return server{newApp(d)} }) }

// server adapts *fiber.App to app.Server.
type server struct{ *fiber.App }

func (s server) Serve(ln net.Listener) error        { return s.Listener(ln) }
func (s server) Shutdown(ctx context.Context) error { return s.ShutdownWithContext(ctx) }

func newApp(d app.Deps) *fiber.App {
	a := fiber.New(fiber.Config{DisableStartupMessage: true, ErrorHandler: problem})
	a.Use(recover.New())
	svc := d.Payments

	writes := []fiber.Handler{authenticate}
	if d.Engine != nil {
		writes = append(writes, idemfiber.New(d.Engine, idemfiber.WithScope(func(c *fiber.Ctx) string {
			s, _ := c.Locals("user_id").(string)
			return s
		})))
	}
	route := func(path string, h fiber.Handler) { a.Post(path, append(writes, h)...) }
	route("/v1/payments", func(c *fiber.Ctx) error {
		var req payments.ChargeRequest
		if err := c.BodyParser(&req); err != nil {
			return payments.Invalid("body must be JSON: " + err.Error())
		}
		p, err := svc.Charge(c.UserContext(), c.Locals("user_id").(string), req)
		if err != nil {
			return err
		}
		c.Location("/v1/payments/" + p.ID)
		return c.Status(http.StatusCreated).JSON(p)
	})
	route("/v1/refunds", func(c *fiber.Ctx) error {
		var req payments.RefundRequest
		if err := c.BodyParser(&req); err != nil {
			return payments.Invalid("body must be JSON: " + err.Error())
		}
		rf, err := svc.Refund(c.UserContext(), c.Locals("user_id").(string), req)
		if err != nil {
			return err
		}
		return c.Status(http.StatusCreated).JSON(rf)
	})
	route("/v1/exports", func(c *fiber.Ctx) error {
		var req payments.ExportRequest
		if err := c.BodyParser(&req); err != nil {
			return payments.Invalid("body must be JSON: " + err.Error())
		}
		b, err := svc.Export(c.UserContext(), req)
		if err != nil {
			return err
		}
		c.Set(fiber.HeaderContentType, "application/octet-stream")
		return c.Send(b)
	})

	a.Get("/v1/payments/:id", func(c *fiber.Ctx) error {
		if p, ok := svc.Payment(c.Params("id")); ok {
			return c.JSON(p)
		}
		return &payments.Error{Status: 404, Title: "Payment not found", Detail: "no payment " + c.Params("id")}
	})
	a.Get("/v1/stats", func(c *fiber.Ctx) error { return c.JSON(svc.Stats()) })
	return a
}

// authenticate stands in for real authentication: it trusts X-User-ID.
func authenticate(c *fiber.Ctx) error {
	user := c.Get("X-User-ID")
	if user == "" {
		return payments.Unauthenticated
	}
	c.Locals("user_id", strings.Clone(user)) // c.Get aliases a buffer fasthttp reuses for the next request
	return c.Next()
}

// problem is the app's error handler: every error becomes an RFC 9457 problem.
func problem(c *fiber.Ctx, err error) error {
	var pe *payments.Error
	var fe *fiber.Error
	switch {
	case errors.As(err, &pe):
	case errors.As(err, &fe):
		pe = &payments.Error{Status: fe.Code, Title: http.StatusText(fe.Code), Detail: fe.Message}
	default:
		pe = &payments.Error{Status: 500, Title: "Internal error", Detail: "the server failed; retry with the same Idempotency-Key"}
	}
	c.Set(fiber.HeaderContentType, payments.ProblemContentType)
	return c.Status(pe.Status).Send(pe.Problem())
}
