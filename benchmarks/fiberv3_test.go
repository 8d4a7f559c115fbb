package benchmarks

import (
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/idempotency"

	"github.com/idemkit/idem/adapters/idemfiberv3"
	idem "github.com/idemkit/idem/core"
)

func init() {
	frameworks = append(frameworks, framework{name: "fiberv3", route: route, build: func(e *idem.Engine) driver {
		if e == nil {
			return newFasthttpDriver(newFiberV3App().Handler())
		}
		return newFasthttpDriver(newFiberV3App(idemfiberv3.New(e, idemfiberv3.WithScope(func(fiber.Ctx) string { return principal }))).Handler())
	}})
}

// newFiberV3App is the app of fiber_test.go on Fiber v3, driven the same
// way (fiberDriver).
func newFiberV3App(mw ...fiber.Handler) *fiber.App {
	app := fiber.New()
	for _, m := range mw {
		app.Use(m)
	}
	h := func(c fiber.Ctx) error {
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

// newFiberV3Builtin is the app of BenchmarkMiddleware/fw=fiberv3 with Fiber
// v3's own idempotency middleware instead of idem.
func newFiberV3Builtin() driver {
	return newFasthttpDriver(newFiberV3App(idempotency.New(idempotency.Config{KeyHeader: "Idempotency-Key"})).Handler())
}

// BenchmarkFiberV3Builtin measures Fiber v3's own idempotency middleware
// (middleware/idempotency, default in-memory storage and lock, header
// Idempotency-Key, 36-character keys) on the same app as
// BenchmarkMiddleware/fw=fiberv3: the second peer idem is compared with.
func BenchmarkFiberV3Builtin(b *testing.B) { benchBuiltin(b, newFiberV3Builtin) }

// BenchmarkFiberV3Peer pairs idem on Fiber v3 with Fiber v3's built-in
// middleware, as BenchmarkFiberPeer does on Fiber v2.
func BenchmarkFiberV3Peer(b *testing.B) { benchPeer(b, "fiberv3", newFiberV3Builtin) }
