package docs

import (
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemkit/idem/adapters/idemecho"
	"github.com/idemkit/idem/adapters/idemfiber"
)

func readmeEcho() {
	e := echo.New()
	var createPayment echo.HandlerFunc
	var auth echo.MiddlewareFunc
	// doc: README.md
	// Echo v4
	e.Use(middleware.Recover())
	e.POST("/v1/payments", createPayment, auth, idemecho.New(engine, idemecho.WithScope(func(c echo.Context) string {
		s, _ := c.Get("user_id").(string)
		return s
	})))
	// doc end
}

func readmeFiber() {
	app := fiber.New()
	var createPayment, auth fiber.Handler
	// doc: README.md
	// Fiber v2 (per route, as here, or on a group or app.Use: keys are scoped by the route matched)
	app.Use(recover.New())
	app.Post("/v1/payments", auth, idemfiber.New(engine, idemfiber.WithScope(func(c *fiber.Ctx) string {
		s, _ := c.Locals("user_id").(string)
		return s
	})), createPayment)
	// doc end
}
