package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
	redisstorage "github.com/gofiber/storage/redis/v3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/adapters/idemfiber"
	"github.com/idemkit/idem/adapters/idemgin"
	"github.com/idemkit/idem/benchmarks/internal/floor"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// service is one load case's server: framework, library and store.
type service struct {
	fw, lib, store string
}

func (s service) String() string { return "fw=" + s.fw + "/lib=" + s.lib + "/store=" + s.store }

// services are the cases of a load run: on Gin and on Fiber v2, the bare
// service (lib none), idem on every store, and each peer on the stores it
// has (Fiber's built-in middleware with its in-memory storage and with
// gofiber/storage's Redis; on Gin the floor of internal/floor, since the
// Go peers of issue #27 are not served by the module proxy).
var services = []service{
	{"gin", "none", "memory"},
	{"gin", "floor", "memory"},
	{"gin", "idem", "memory"},
	{"gin", "idem", "redis"},
	{"gin", "idem", "postgres"},
	{"fiber", "none", "memory"},
	{"fiber", "builtin", "memory"},
	{"fiber", "builtin", "redis"},
	{"fiber", "idem", "memory"},
	{"fiber", "idem", "redis"},
	{"fiber", "idem", "postgres"},
}

// ledger is the payments service's state: executions per idempotency key,
// so that a run can tell how many keys a library executed twice.
type ledger struct {
	seq        atomic.Int64
	executions atomic.Int64
	keysTwice  atomic.Int64
	byKey      sync.Map // key -> *atomic.Int32
}

// stats is GET /stats: what the ledger saw since the service started.
type stats struct {
	Executions int64 `json:"executions"`
	KeysTwice  int64 `json:"keys_twice"`
}

// chargeRequest is POST /v1/payments' body, as in examples/.
type chargeRequest struct {
	Amount int64 `json:"amount"`
}

// payment is POST /v1/payments' 201 body.
type payment struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Status string `json:"status"`
}

// charge executes one payment for key and returns it, or an error for a
// body that is not a positive amount.
func (l *ledger) charge(key string, body []byte) (payment, error) {
	var req chargeRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Amount <= 0 {
		return payment{}, errors.New(`body must be {"amount": N} with N > 0`)
	}
	l.executions.Add(1)
	if key != "" {
		v, ok := l.byKey.Load(key)
		if !ok { // fasthttp's strings alias its buffers: the map keeps a copy
			v, _ = l.byKey.LoadOrStore(strings.Clone(key), new(atomic.Int32))
		}
		if v.(*atomic.Int32).Add(1) == 2 {
			l.keysTwice.Add(1)
		}
	}
	return payment{ID: "pay_" + strconv.FormatInt(l.seq.Add(1), 10), Amount: req.Amount, Status: "succeeded"}, nil
}

func (l *ledger) stats() stats {
	return stats{Executions: l.executions.Load(), KeysTwice: l.keysTwice.Load()}
}

// backend is what a service needs from its store: an idem.Store, or a
// Fiber storage for the built-in middleware, and how to let them go.
type backend struct {
	store   idem.Store
	storage fiber.Storage
	close   func()
}

// openBackend opens the store named by s.store for s.lib: memory, Redis
// (IDEM_REDIS_URL, a fresh key prefix for idem) or PostgreSQL
// (IDEM_POSTGRES_URL, a fresh table in schema idem_bench, dropped on close).
func openBackend(ctx context.Context, s service) (backend, error) {
	tag := strings.ToLower(rand.Text()[:8])
	switch s.store {
	case "memory":
		if s.lib == "builtin" {
			return backend{close: func() {}}, nil // the built-in's own storage
		}
		m := memstore.New()
		return backend{store: m, close: func() { m.Close() }}, nil
	case "redis":
		opts, err := redis.ParseURL(os.Getenv("IDEM_REDIS_URL"))
		if err != nil {
			return backend{}, fmt.Errorf("IDEM_REDIS_URL: %w", err)
		}
		c := redis.NewClient(opts)
		if err := c.Ping(ctx).Err(); err != nil {
			c.Close()
			return backend{}, fmt.Errorf("redis: %w", err)
		}
		if s.lib == "builtin" {
			return backend{storage: redisstorage.NewFromConnection(c), close: func() { c.Close() }}, nil
		}
		prefix := "idemload:" + tag + ":"
		return backend{store: redisstore.New(c, redisstore.WithPrefix(prefix)), close: func() {
			iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				c.Unlink(ctx, iter.Val())
			}
			c.Close()
		}}, nil
	case "postgres":
		pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_URL"))
		if err != nil {
			return backend{}, fmt.Errorf("IDEM_POSTGRES_URL: %w", err)
		}
		if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS idem_bench`); err != nil {
			pool.Close()
			return backend{}, fmt.Errorf("postgres: %w", err)
		}
		table := "load_" + tag
		st := pgstore.New(pool, pgstore.WithTable("idem_bench."+table))
		if err := st.EnsureSchema(ctx); err != nil {
			pool.Close()
			return backend{}, err
		}
		return backend{store: st, close: func() {
			_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{"idem_bench", table}.Sanitize())
			pool.Close()
		}}, nil
	}
	return backend{}, fmt.Errorf("unknown store %q", s.store)
}

// server is a running service.
type server struct {
	url      string
	shutdown func() error
}

// serve starts service s on ln: POST /v1/payments (the payments contract of
// examples/: {"amount": N}, Idempotency-Key, X-User-Id as the principal
// idem scopes keys by), answered 201 with the payment and a Location, and
// GET /stats.
func serve(ctx context.Context, s service, ln net.Listener) (*server, error) {
	b, err := openBackend(ctx, s)
	if err != nil {
		return nil, err
	}
	var e *idem.Engine
	if s.lib == "idem" {
		if e, err = idem.New(b.store, idem.WithRetention(10*time.Minute)); err != nil {
			b.close()
			return nil, err
		}
	}
	l := new(ledger)
	url := "http://" + ln.Addr().String()
	switch s.fw {
	case "gin":
		srv := &http.Server{Handler: ginApp(s, e, l), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		return &server{url: url, shutdown: func() error {
			err := srv.Shutdown(context.Background())
			if e != nil {
				_ = e.Close(context.Background())
			}
			b.close()
			return err
		}}, nil
	case "fiber":
		app := fiberApp(s, e, b, l)
		go func() { _ = app.Listener(ln) }()
		return &server{url: url, shutdown: func() error {
			err := app.ShutdownWithTimeout(10 * time.Second)
			if e != nil {
				_ = e.Close(context.Background())
			}
			b.close()
			return err
		}}, nil
	}
	b.close()
	return nil, fmt.Errorf("unknown framework %q", s.fw)
}

func ginApp(s service, e *idem.Engine, l *ledger) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	var mw []gin.HandlerFunc
	switch s.lib {
	case "idem":
		mw = append(mw, idemgin.New(e, idemgin.WithScope(func(c *gin.Context) string { return c.GetHeader("X-User-Id") })))
	case "floor":
		mw = append(mw, floor.Gin(floor.New()))
	}
	r.POST("/v1/payments", append(mw, func(c *gin.Context) {
		body, err := c.GetRawData()
		if err != nil {
			c.Status(http.StatusBadRequest)
			return
		}
		p, err := l.charge(c.GetHeader("Idempotency-Key"), body)
		if err != nil {
			c.String(http.StatusBadRequest, err.Error())
			return
		}
		c.Header("Location", "/v1/payments/"+p.ID)
		c.JSON(http.StatusCreated, p)
	})...)
	r.GET("/stats", func(c *gin.Context) { c.JSON(http.StatusOK, l.stats()) })
	return r
}

func fiberApp(s service, e *idem.Engine, b backend, l *ledger) *fiber.App {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	var mw []fiber.Handler
	switch s.lib {
	case "idem":
		mw = append(mw, idemfiber.New(e, idemfiber.WithScope(func(c *fiber.Ctx) string { return c.Get("X-User-Id") })))
	case "builtin":
		mw = append(mw, idempotency.New(idempotency.Config{KeyHeader: "Idempotency-Key", Lifetime: 10 * time.Minute, Storage: b.storage}))
	}
	app.Post("/v1/payments", append(mw, func(c *fiber.Ctx) error {
		p, err := l.charge(c.Get("Idempotency-Key"), c.Body())
		if err != nil {
			return c.Status(http.StatusBadRequest).SendString(err.Error())
		}
		c.Set("Location", "/v1/payments/"+p.ID)
		return c.Status(http.StatusCreated).JSON(p)
	})...)
	app.Get("/stats", func(c *fiber.Ctx) error { return c.JSON(l.stats()) })
	return app
}
