// Command fiberv3 is idem on Fiber v3 in one file: one store, one handler, graceful
// shutdown. POST /v1/orders places an order at most once per
// Idempotency-Key; a retry with the same key gets the stored answer with
// Idempotent-Replayed: true. Copy this folder to start a service; the full
// payments service on every framework and store is examples/payments.
//
//	go run ./examples/fiberv3
//	curl -i -X POST localhost:8080/v1/orders -H 'X-User-ID: alice' \
//	  -H 'Idempotency-Key: order-1' -d '{"sku":"book","quantity":1}'
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/recover"

	"github.com/idemkit/idem/adapters/idemfiberv3"
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
	app := fiber.New(fiber.Config{})
	app.Use(recover.New()) // outside idem: a panic releases the key, then recovery answers 500
	app.Post("/v1/orders", authenticate, idemfiberv3.New(engine, idemfiberv3.WithScope(func(c fiber.Ctx) string {
		return fiber.Locals[string](c, "user_id") // keys are scoped per caller
	})), createOrder)

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
	go func() { errc <- app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := app.ShutdownWithContext(shutdown); err != nil {
		return err
	}
	return engine.Close(shutdown)
}

// authenticate stands in for your authentication: it sets the principal.
func authenticate(c fiber.Ctx) error {
	user := c.Get("X-User-ID")
	if user == "" {
		return fiber.NewError(http.StatusUnauthorized, "send X-User-ID")
	}
	fiber.Locals(c, "user_id", strings.Clone(user)) // c.Get aliases a buffer fasthttp reuses
	return c.Next()
}

// order is the body of POST /v1/orders and of its answer.
type order struct {
	ID       string `json:"id"`
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

var placed atomic.Int64

// createOrder is the handler; it knows nothing about idem. Its error is
// rendered by Fiber's error handler inside idem: a 4xx is stored too.
func createOrder(c fiber.Ctx) error {
	var o order
	if err := c.Bind().Body(&o); err != nil || o.SKU == "" || o.Quantity <= 0 {
		return fiber.NewError(http.StatusBadRequest, `send {"sku": "...", "quantity": N > 0}`)
	}
	o.ID = fmt.Sprintf("ord_%d", placed.Add(1)) // place the order here: it runs once per key
	return c.Status(http.StatusCreated).JSON(o)
}
