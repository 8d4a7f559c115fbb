package docs

import (
	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/recover"
	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"

	"github.com/idemkit/idem/adapters/idemechov5"
	"github.com/idemkit/idem/adapters/idemfiberv3"
)

func readmeFiberV3() {
	app := fiber.New()
	var createPayment, auth fiber.Handler
	// doc: README.md
	// Fiber v3 (github.com/gofiber/fiber/v3): fiber.Ctx is an interface
	app.Use(recover.New())
	app.Post("/v1/payments", auth, idemfiberv3.New(engine, idemfiberv3.WithScope(func(c fiber.Ctx) string {
		return fiber.Locals[string](c, "user_id")
	})), createPayment)
	// in the handler: info, _ := idem.InfoFromContext(c) (or c.Context()): both work
	// doc end
}

func readmeEchoV5() {
	e := echo.New()
	var createPayment echo.HandlerFunc
	var auth echo.MiddlewareFunc
	// doc: README.md
	// Echo v5 (github.com/labstack/echo/v5): *echo.Context is a struct
	e.Use(middleware.Recover())
	e.POST("/v1/payments", createPayment, auth, idemechov5.New(engine, idemechov5.WithScope(func(c *echo.Context) string {
		s, _ := echo.ContextGet[string](c, "user_id")
		return s
	})))
	// doc end
}
