package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"database/sql"

	"github.com/gin-gonic/gin"
	"github.com/go-sql-driver/mysql"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
	redisstorage "github.com/gofiber/storage/redis/v3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/adapters/idemfiber"
	"github.com/idemkit/idem/adapters/idemgin"
	"github.com/idemkit/idem/benchmarks/internal/floor"
	"github.com/idemkit/idem/benchmarks/internal/payments"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// service is one load case's server: framework, library and store.
type service struct {
	fw, lib, store string
}

func (s service) String() string { return "fw=" + s.fw + "/lib=" + s.lib + "/store=" + s.store }

// services are the cases of a load run: on Gin and on Fiber v2, the bare
// service (lib none), idem on every store, and the peers this module can
// build on the stores they have (Fiber's built-in middleware with its
// in-memory storage and with gofiber/storage's Redis; on Gin the floor of
// internal/floor). Store redis is a go-redis client with its default
// options and the store's defaults (the commands of concurrent requests
// batched); redis-plain is the same client with redisstore.WithoutBatching,
// each command on its own pooled connection (a pool of 10 connections per
// GOMAXPROCS: 10 here).
var services = []service{
	{"gin", "none", "memory"},
	{"gin", "floor", "memory"},
	{"gin", "idem", "memory"},
	{"gin", "idem", "redis"},
	{"gin", "idem", "redis-plain"},
	{"gin", "idem", "postgres"},
	{"gin", "idem", "mysql"},
	{"fiber", "none", "memory"},
	{"fiber", "builtin", "memory"},
	{"fiber", "builtin", "redis"},
	{"fiber", "idem", "memory"},
	{"fiber", "idem", "redis"},
	{"fiber", "idem", "redis-plain"},
	{"fiber", "idem", "postgres"},
	{"fiber", "idem", "mysql"},
}

// sqlConns is the connection pool size of the PostgreSQL and MySQL rows
// (-sqlconns, default 16); 0 keeps the driver's default: pgxpool's (the
// larger of 4 and the number of CPUs) and database/sql's (unbounded open
// connections, two kept idle, so that at 64 workers most requests open a
// connection of their own). See stores/pgstore's and stores/mysqlstore's
// READMEs.
var sqlConns = 16

// backend is what a service needs from its store: an idem.Store, or a
// Fiber storage for the built-in middleware, and how to let them go.
type backend struct {
	store   idem.Store
	storage fiber.Storage
	close   func()
}

// openBackend opens the store named by s.store for s.lib: memory, Redis
// (IDEM_REDIS_URL, a fresh key prefix for idem) or PostgreSQL
// (IDEM_POSTGRES_URL, a fresh table in schema idem_bench, dropped on close)
// or MySQL (IDEM_MYSQL_DSN, a fresh table and its procedure, dropped on
// close); redis is the store's default (batched), redis-plain the store
// with WithoutBatching.
func openBackend(ctx context.Context, s service) (backend, error) {
	tag := strings.ToLower(rand.Text()[:8])
	switch s.store {
	case "memory":
		if s.lib == "builtin" {
			return backend{close: func() {}}, nil // the built-in's own storage
		}
		m := memstore.New()
		return backend{store: m, close: func() { m.Close() }}, nil
	case "redis", "redis-plain":
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
		sopts := []redisstore.Option{redisstore.WithPrefix(prefix)}
		if s.store == "redis-plain" {
			sopts = append(sopts, redisstore.WithoutBatching())
		}
		return backend{store: redisstore.New(c, sopts...), close: func() {
			// Not ctx: serveMain's is cancelled by the SIGTERM that ends
			// the server, which would leave every record behind (they
			// expire with the retention, 10 minutes, filling the shared
			// Redis meanwhile).
			ctx := context.Background()
			var keys []string
			iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				if keys = append(keys, iter.Val()); len(keys) == 1000 {
					c.Unlink(ctx, keys...)
					keys = keys[:0]
				}
			}
			if len(keys) > 0 {
				c.Unlink(ctx, keys...)
			}
			c.Close()
		}}, nil
	case "postgres":
		cfg, err := pgxpool.ParseConfig(os.Getenv("IDEM_POSTGRES_URL"))
		if err != nil {
			return backend{}, fmt.Errorf("IDEM_POSTGRES_URL: %w", err)
		}
		if sqlConns > 0 {
			cfg.MaxConns = int32(sqlConns)
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return backend{}, fmt.Errorf("postgres: %w", err)
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
	case "mysql":
		cfg, err := mysql.ParseDSN(os.Getenv("IDEM_MYSQL_DSN"))
		if err != nil {
			return backend{}, fmt.Errorf("IDEM_MYSQL_DSN: %w", err)
		}
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return backend{}, fmt.Errorf("IDEM_MYSQL_DSN: %w", err)
		}
		db := sql.OpenDB(conn)
		if sqlConns > 0 {
			db.SetMaxOpenConns(sqlConns)
			db.SetMaxIdleConns(sqlConns)
		}
		table := "idem_load_" + tag
		st := mysqlstore.New(db, mysqlstore.WithTable(table))
		if err := st.EnsureSchema(ctx); err != nil {
			db.Close()
			return backend{}, fmt.Errorf("mysql: %w", err)
		}
		return backend{store: st, close: func() {
			_ = st.Close()
			for _, q := range []string{"DROP TABLE IF EXISTS " + "`" + table + "`", "DROP PROCEDURE IF EXISTS `" + table + mysqlstore.ProcSuffix + "`"} {
				_, _ = db.Exec(q)
			}
			db.Close()
		}}, nil
	}
	return backend{}, fmt.Errorf("unknown store %q", s.store)
}

// server is a running service.
type server struct {
	url      string
	shutdown func() error
}

// serve starts service s on ln: the payments service (internal/payments)
// with s's library in front, and GET /stats.
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
	l := new(payments.Ledger)
	var app any
	switch s.fw {
	case "gin":
		app = payments.GinApp(l, ginMiddleware(s, e))
	case "fiber":
		app = payments.FiberApp(l, fiberMiddleware(s, e, b))
	default:
		b.close()
		return nil, fmt.Errorf("unknown framework %q", s.fw)
	}
	srv, err := payments.Start(app, ln)
	if err != nil {
		b.close()
		return nil, err
	}
	return &server{url: srv.URL, shutdown: func() error {
		err := srv.Shutdown()
		if e != nil {
			_ = e.Close(context.Background())
		}
		b.close()
		return err
	}}, nil
}

// ginMiddleware is s's library on Gin (none for lib none).
func ginMiddleware(s service, e *idem.Engine) gin.HandlerFunc {
	switch s.lib {
	case "idem":
		return idemgin.New(e, idemgin.WithScope(func(c *gin.Context) string { return c.GetHeader("X-User-Id") }))
	case "floor":
		return floor.Gin(floor.New())
	}
	return nil
}

// fiberMiddleware is s's library on Fiber v2 (none for lib none).
func fiberMiddleware(s service, e *idem.Engine, b backend) fiber.Handler {
	switch s.lib {
	case "idem":
		return idemfiber.New(e, idemfiber.WithScope(func(c *fiber.Ctx) string { return c.Get("X-User-Id") }))
	case "builtin":
		return idempotency.New(idempotency.Config{KeyHeader: "Idempotency-Key", Lifetime: 10 * time.Minute, Storage: b.storage})
	}
	return nil
}
