// Command quickstart is the README's quick start: a Gin service whose
// POST /v1/payments runs at most once per idempotency key.
package main

import (
	"log"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/adapters/idemgin"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

func main() {
	store := memstore.New()        // one process; redisstore, mongostore, pgstore or mysqlstore for several
	engine, err := idem.New(store) // POST and PATCH need a key; 24h retention, 30s lease
	if err != nil {
		log.Fatal(err)
	}
	r := gin.New()
	r.Use(gin.Recovery(), auth)
	r.POST("/v1/payments", idemgin.New(engine, idemgin.WithScope(func(c *gin.Context) string {
		return c.GetString("user_id") // keys are scoped per caller
	})), createPayment)
	log.Fatal(r.Run("127.0.0.1:8080"))
}

// auth stands in for your authentication: it sets the principal.
func auth(c *gin.Context) {
	user := c.GetHeader("X-User-ID")
	if user == "" {
		c.AbortWithStatus(http.StatusUnauthorized)
		return
	}
	c.Set("user_id", user)
}

func createPayment(c *gin.Context) {
	var in struct {
		Amount int `json:"amount"`
	}
	if err := c.ShouldBindJSON(&in); err != nil {
		c.JSON(http.StatusBadRequest, gin.H{"error": err.Error()})
		return
	}
	info, _ := idem.InfoFromContext(c.Request.Context())
	// Charge the card here, passing info.Key as the provider's idempotency key.
	c.JSON(http.StatusCreated, gin.H{"id": "pay_" + info.Key[:12], "amount": in.Amount})
}
