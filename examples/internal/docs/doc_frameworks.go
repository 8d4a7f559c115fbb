package docs

import (
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/adapters/idemecho"
	"github.com/idemkit/idem/adapters/idemfiber"
	idem "github.com/idemkit/idem/core"
)

func idemechoDoc() {
	app := echo.New()
	var auth echo.MiddlewareFunc
	// doc: adapters/idemecho/idemecho.go
	e, err := idem.New(store)
	api := app.Group("/v1", auth) // auth sets "user_id"
	api.Use(idemecho.New(e, idemecho.WithScope(func(c echo.Context) string {
		s, _ := c.Get("user_id").(string)
		return s
	})))
	// doc end
	_ = err
}

func idemfiberDoc() {
	app := fiber.New()
	var auth, createPayment fiber.Handler
	// doc: adapters/idemfiber/idemfiber.go
	e, err := idem.New(store)
	app.Post("/v1/payments", auth, idemfiber.New(e, idemfiber.WithScope(func(c *fiber.Ctx) string {
		s, _ := c.Locals("user_id").(string)
		return s
	})), createPayment)
	// doc end
	_ = err
}

func idemwebhookBridgesDoc() {
	r, e, app := gin.New(), echo.New(), fiber.New()
	var h http.Handler
	// doc: adapters/idemwebhook/doc.go
	r.POST("/webhooks/stripe", gin.WrapH(h))             // Gin
	e.POST("/webhooks/stripe", echo.WrapHandler(h))      // Echo v4 and v5
	app.Post("/webhooks/stripe", adaptor.HTTPHandler(h)) // Fiber v2 (fiber/v2/middleware/adaptor); Fiber v3 takes h as it is
	// doc end
}
