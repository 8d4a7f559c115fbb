package idemechov5_test

import (
	"log"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"

	"github.com/idemkit/idem/adapters/idemechov5"
	idem "github.com/idemkit/idem/core"
)

// store is the application's [idem.Store]: memstore.New() for one process
// (github.com/idemkit/idem/stores/memstore), redisstore or mongostore for
// several instances. The example leaves it unset so that this module does not
// require a store module (its tests, and a runnable example with a replay,
// live in tests/adapters/idemechov5).
var store idem.Store

func Example() {
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
	app.POST("/v1/payments", func(c *echo.Context) error {
		info, _ := idem.InfoFromContext(c.Request().Context())
		return c.JSON(201, map[string]string{"id": "pay_1", "idempotency_key": info.Key})
	})
	_ = app // app.Start(":8080")
}
