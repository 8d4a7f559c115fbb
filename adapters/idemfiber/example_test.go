package idemfiber_test

import (
	"log"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"

	"github.com/idemkit/idem/adapters/idemfiber"
	idem "github.com/idemkit/idem/core"
)

// store is the application's [idem.Store]: memstore.New() for one process
// (github.com/idemkit/idem/stores/memstore), redisstore or mongostore for
// several instances. The example leaves it unset so that this module does not
// require a store module (its tests, on memstore, live in tests/adapters).
var store idem.Store

func Example() {
	e, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	app := fiber.New()
	app.Use(recover.New())
	auth := func(c *fiber.Ctx) error { // the app's authentication
		c.Locals("user_id", "u_123")
		return c.Next()
	}
	idemMW := idemfiber.New(e, idemfiber.WithScope(func(c *fiber.Ctx) string { s, _ := c.Locals("user_id").(string); return s }))
	app.Post("/v1/payments", auth, idemMW, func(c *fiber.Ctx) error {
		info, _ := idem.InfoFromContext(c.UserContext())
		return c.Status(201).JSON(fiber.Map{"id": "pay_1", "idempotency_key": info.Key})
	})
	_ = app // app.Listen(":8080")
}
