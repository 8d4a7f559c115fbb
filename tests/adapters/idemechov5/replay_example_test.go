package idemechov5_test

import (
	"fmt"
	"log"
	"net/http/httptest"
	"strings"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"

	"github.com/idemkit/idem/adapters/idemechov5"
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
	app := echo.New()
	app.Use(middleware.Recover())
	app.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // the app's authentication
		return func(c *echo.Context) error {
			c.Set("user_id", "u_123")
			return next(c)
		}
	})
	app.Use(idemechov5.New(e, idemechov5.WithScope(func(c *echo.Context) string {
		s, _ := echo.ContextGet[string](c, "user_id")
		return s
	})))
	charges := 0
	app.POST("/v1/payments", func(c *echo.Context) error {
		charges++
		info, _ := idem.InfoFromContext(c.Request().Context())
		return c.JSON(201, map[string]any{"id": "pay_1", "key_len": len(info.Key)})
	})

	for range 2 { // a retry with the same key is replayed
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		rec := httptest.NewRecorder()
		app.ServeHTTP(rec, req)
		fmt.Print(rec.Code, " ", rec.Header().Get("Idempotent-Replayed"), " ", rec.Body.String())
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201  {"id":"pay_1","key_len":64}
	// 201 true {"id":"pay_1","key_len":64}
	// charges: 1
}
