package idemgin_test

import (
	"log"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/adapters/idemgin"
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
	r := gin.New()
	r.Use(gin.Recovery())
	r.Use(func(c *gin.Context) { // the app's authentication
		c.Set("user_id", "u_123")
		c.Next()
	})
	r.Use(idemgin.New(e, idemgin.WithScope(func(c *gin.Context) string { return c.GetString("user_id") })))
	r.POST("/v1/payments", func(c *gin.Context) {
		info, _ := idem.InfoFromContext(c.Request.Context())
		c.JSON(201, gin.H{"id": "pay_1", "idempotency_key": info.Key})
	})
	_ = r // r.Run(":8080")
}
