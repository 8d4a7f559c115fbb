package docs

import (
	"github.com/gofiber/fiber/v3"
	"github.com/labstack/echo/v5"

	"github.com/idemkit/idem/adapters/idemechov5"
	"github.com/idemkit/idem/adapters/idemfiberv3"
	idem "github.com/idemkit/idem/core"
)

func idemechov5Doc() {
	app := echo.New()
	var auth echo.MiddlewareFunc
	// doc: adapters/idemechov5/doc.go
	e, err := idem.New(store)
	api := app.Group("/v1", auth) // auth sets "user_id"
	api.Use(idemechov5.New(e, idemechov5.WithScope(func(c *echo.Context) string {
		s, _ := echo.ContextGet[string](c, "user_id")
		return s
	})))
	// doc end
	_ = err
}

func idemfiberv3Doc() {
	app := fiber.New()
	var auth, createPayment fiber.Handler
	// doc: adapters/idemfiberv3/doc.go
	e, err := idem.New(store)
	app.Post("/v1/payments", auth, idemfiberv3.New(e, idemfiberv3.WithScope(func(c fiber.Ctx) string {
		return fiber.Locals[string](c, "user_id")
	})), createPayment)
	// doc end
	_ = err
}
