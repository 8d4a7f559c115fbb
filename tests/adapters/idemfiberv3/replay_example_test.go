package idemfiberv3_test

import (
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"strings"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/recover"

	"github.com/idemkit/idem/adapters/idemfiberv3"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

func Example() {
	store := memstore.New()
	defer store.Close()
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
	charges := 0
	app.Post("/v1/payments", auth, idemMW, func(c fiber.Ctx) error {
		charges++
		info, _ := idem.InfoFromContext(c) // c is a context.Context in Fiber v3
		return c.Status(201).JSON(fiber.Map{"id": "pay_1", "key_len": len(info.Key)})
	})

	for range 2 { // a retry with the same key is replayed
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		resp, err := app.Test(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body))
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201  {"id":"pay_1","key_len":64}
	// 201 true {"id":"pay_1","key_len":64}
	// charges: 1
}
