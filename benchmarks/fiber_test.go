package benchmarks

import (
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
	"github.com/valyala/fasthttp"

	"github.com/idemkit/idem/adapters/idemfiber"
	idem "github.com/idemkit/idem/core"
)

func init() {
	frameworks = append(frameworks, framework{name: "fiber", route: route, build: func(e *idem.Engine) driver {
		if e == nil {
			return newFiberDriver(newFiberApp())
		}
		return newFiberDriver(newFiberApp(idemfiber.New(e, idemfiber.WithScope(func(*fiber.Ctx) string { return principal }))))
	}})
}

// fiberDriver drives a Fiber app (v2 or v3) through app.Handler() with one
// reused *fasthttp.RequestCtx: no network, no app.Test.
type fiberDriver struct {
	h   fasthttp.RequestHandler
	ctx *fasthttp.RequestCtx
}

func newFiberApp(mw ...fiber.Handler) *fiber.App {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	for _, m := range mw {
		app.Use(m)
	}
	h := func(c *fiber.Ctx) error {
		_ = c.Body()
		executions.Add(1)
		if keyCounts.Load() != nil {
			countKey(c.Get(idem.DefaultHeader))
		}
		c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
		if c.Method() == http.MethodGet {
			c.Status(http.StatusOK)
		} else {
			c.Status(http.StatusCreated)
		}
		return c.Send(respBody)
	}
	app.Post(route, h)
	app.Get(route, h)
	return app
}

func newFiberDriver(app *fiber.App) *fiberDriver { return newFasthttpDriver(app.Handler()) }

func newFasthttpDriver(h fasthttp.RequestHandler) *fiberDriver {
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(new(fasthttp.Request), nil, nil)
	ctx.Request.Header.Set("Content-Type", "application/json")
	ctx.Request.Header.Set("X-User-Id", principal)
	return &fiberDriver{h: h, ctx: ctx}
}

func (d *fiberDriver) do(method, key string) int {
	req := &d.ctx.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(route)
	if method == http.MethodGet {
		req.ResetBody()
	} else {
		req.SetBody(reqBody)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	} else {
		req.Header.Del("Idempotency-Key")
	}
	d.ctx.Response.Reset()
	d.ctx.ResetUserValues() // as fasthttp's server does between requests (Fiber keeps UserContext there)
	d.h(d.ctx)
	return d.ctx.Response.StatusCode()
}

// newFiberBuiltin is the app of BenchmarkMiddleware/fw=fiber with Fiber's
// own idempotency middleware instead of idem.
func newFiberBuiltin() driver {
	return newFiberDriver(newFiberApp(idempotency.New(idempotency.Config{KeyHeader: "Idempotency-Key"})))
}

// BenchmarkFiberBuiltin measures Fiber v2's own idempotency middleware
// (middleware/idempotency, default in-memory storage and lock, header
// Idempotency-Key, 36-character keys) on the same app as
// BenchmarkMiddleware/fw=fiber: the peer idem is compared with.
func BenchmarkFiberBuiltin(b *testing.B) { benchBuiltin(b, newFiberBuiltin) }

// benchBuiltin measures a framework's own idempotency middleware on the
// fresh and replay paths, as BenchmarkMiddleware measures idem.
func benchBuiltin(b *testing.B, builtin func() driver) {
	b.Run("path=fresh", func(b *testing.B) {
		d := builtin()
		b.ReportAllocs()
		for b.Loop() {
			if code := d.do(http.MethodPost, newKey()); code != http.StatusCreated {
				b.Fatalf("fresh: %s", statusText(code))
			}
		}
	})
	b.Run("path=replay", func(b *testing.B) {
		d := builtin()
		key := newKey()
		if code := d.do(http.MethodPost, key); code != http.StatusCreated {
			b.Fatalf("first: %s", statusText(code))
		}
		before := executions.Load()
		b.ReportAllocs()
		for b.Loop() {
			if code := d.do(http.MethodPost, key); code != http.StatusCreated {
				b.Fatalf("replay: %s", statusText(code))
			}
		}
		if n := executions.Load() - before; n != 0 {
			b.Fatalf("replay ran the handler %d times", n)
		}
	})
}
