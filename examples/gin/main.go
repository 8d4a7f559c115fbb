// Command gin is idem on Gin in one file: one store, one handler, graceful
// shutdown. POST /v1/orders places an order at most once per
// Idempotency-Key; a retry with the same key gets the stored answer with
// Idempotent-Replayed: true. Copy this folder to start a service; the full
// payments service on every framework and store is examples/payments.
//
//	go run ./examples/gin
//	curl -i -X POST localhost:8080/v1/orders -H 'X-User-ID: alice' \
//	  -H 'Idempotency-Key: order-1' -d '{"sku":"book","quantity":1}'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/adapters/idemgin"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address (port 0 picks a free one)")
	flag.Parse()
	if err := run(*addr); err != nil {
		log.Fatal(err)
	}
}

func run(addr string) error {
	// One process: memstore. Several instances share redisstore,
	// mongostore, pgstore or mysqlstore instead.
	store := memstore.New()
	defer store.Close()
	engine, err := idem.New(store) // POST and PATCH need a key; 24h retention, 30s lease
	if err != nil {
		return err
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.Recovery()) // outside idem: a panic releases the key, then recovery answers 500
	r.POST("/v1/orders", authenticate, idemgin.New(engine, idemgin.WithScope(func(c *gin.Context) string {
		return c.GetString("user_id") // keys are scoped per caller
	})), createOrder)
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}

	// Serve until SIGINT or SIGTERM, then shut down gracefully: stop
	// accepting, let in-flight orders finish, and let engine.Close wait for
	// the completions it still retries after a store error.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return engine.Close(shutdown)
}

// authenticate stands in for your authentication: it sets the principal.
func authenticate(c *gin.Context) {
	user := c.GetHeader("X-User-ID")
	if user == "" {
		c.AbortWithStatusJSON(http.StatusUnauthorized, gin.H{"error": "send X-User-ID"})
		return
	}
	c.Set("user_id", user)
}

// order is the body of POST /v1/orders and of its answer.
type order struct {
	ID       string `json:"id"`
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

var placed atomic.Int64

// createOrder is the handler; it knows nothing about idem.
func createOrder(c *gin.Context) {
	var o order
	if err := c.ShouldBindJSON(&o); err != nil || o.SKU == "" || o.Quantity <= 0 {
		c.JSON(http.StatusBadRequest, gin.H{"error": `send {"sku": "...", "quantity": N > 0}`}) // a 4xx is stored too
		return
	}
	o.ID = fmt.Sprintf("ord_%d", placed.Add(1)) // place the order here: it runs once per key
	c.JSON(http.StatusCreated, o)
}
