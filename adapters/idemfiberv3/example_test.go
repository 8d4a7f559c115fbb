package idemfiberv3_test

import (
	"log"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/recover"

	"github.com/idemkit/idem/adapters/idemfiberv3"
	idem "github.com/idemkit/idem/core"
)

// store is the application's [idem.Store]: memstore.New() for one process
// (github.com/idemkit/idem/stores/memstore), redisstore or mongostore for
// several instances. The example leaves it unset so that this module does not
// require a store module (its tests, and a runnable example with a replay,
// live in tests/adapters/idemfiberv3).
var store idem.Store

func Example() {
	e, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	app := fiber.New()
	app.Use(recover.New())
	auth := func(c fiber.Ctx) error { // the app's authentication
		fiber.Locals(c, "user_id", "u_123")
		return c.Next()
	}
	idemMW := idemfiberv3.New(e, idemfiberv3.WithScope(func(c fiber.Ctx) string { return fiber.Locals[string](c, "user_id") }))
	app.Post("/v1/payments", auth, idemMW, func(c fiber.Ctx) error {
		info, _ := idem.InfoFromContext(c) // c is a context.Context in Fiber v3
		return c.Status(201).JSON(fiber.Map{"id": "pay_1", "idempotency_key": info.Key})
	})
	_ = app // app.Listen(":8080")
}
