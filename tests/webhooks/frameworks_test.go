package webhooks

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	fiberv3 "github.com/gofiber/fiber/v3"
	"github.com/labstack/echo/v4"
	echov5 "github.com/labstack/echo/v5"
)

// The receiver is a net/http handler; Gin, Echo and Fiber mount it through
// their own bridges (gin.WrapH, echo.WrapHandler in v4 and v5, Fiber v2's
// adaptor and Fiber v3's own handler adaptation, both converting from
// fasthttp). Through each, the raw body and the signature
// headers reach verification intact, concurrent duplicates run once, the
// 503 keeps its Retry-After, and a forged delivery gets 400.
func TestFrameworks(t *testing.T) {
	for name, serve := range map[string]func(*testing.T, http.Handler, http.Handler) string{
		"gin":     serveGin,
		"echo":    serveEcho,
		"echov5":  serveEchoV5,
		"fiber":   serveFiber,
		"fiberv3": serveFiberV3,
	} {
		t.Run(name, func(t *testing.T) {
			newStore := newStores()["memory"]
			t.Run("ConcurrentDuplicates", func(t *testing.T) { testConcurrentDuplicates(t, newStore(t), serve) })
			t.Run("SendersRetrying", func(t *testing.T) { testSendersRetrying(t, newStore(t), serve) })
			t.Run("Forged", func(t *testing.T) {
				rg := newRig(t, newEngine(t, newStore(t)), serve)
				body := stripeBody("evt_forged")
				h := rg.stripe.SignedHeader(time.Now(), body)
				body[len(body)-2] = ' ' // one byte changed after signing
				a, err := rg.post(context.Background(), "/stripe", h, body)
				if err != nil || a.Status != http.StatusBadRequest || a.Type != "webhook-signature-invalid" {
					t.Fatalf("%s %v", a, err)
				}
			})
		})
	}
}

func serveGin(t *testing.T, standard, stripe http.Handler) string {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/standard", gin.WrapH(standard))
	r.POST("/stripe", gin.WrapH(stripe))
	return newServer(t, r)
}

func serveEcho(t *testing.T, standard, stripe http.Handler) string {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.POST("/standard", echo.WrapHandler(standard))
	e.POST("/stripe", echo.WrapHandler(stripe))
	return newServer(t, e)
}

func serveFiber(t *testing.T, standard, stripe http.Handler) string {
	app := fiber.New(fiber.Config{DisableStartupMessage: true, IdleTimeout: time.Second})
	app.Post("/standard", adaptor.HTTPHandler(standard))
	app.Post("/stripe", adaptor.HTTPHandler(stripe))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = app.Listener(ln) }()
	t.Cleanup(func() { _ = app.ShutdownWithTimeout(10 * time.Second); <-done })
	return "http://" + ln.Addr().String()
}

func serveEchoV5(t *testing.T, standard, stripe http.Handler) string {
	e := echov5.New()
	e.POST("/standard", echov5.WrapHandler(standard))
	e.POST("/stripe", echov5.WrapHandler(stripe))
	return newServer(t, e)
}

// serveFiberV3 registers the handlers directly: Fiber v3 adapts net/http
// handlers itself (adaptor.HTTPHandler does the same).
func serveFiberV3(t *testing.T, standard, stripe http.Handler) string {
	app := fiberv3.New(fiberv3.Config{IdleTimeout: time.Second})
	app.Post("/standard", standard)
	app.Post("/stripe", stripe)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = app.Listener(ln, fiberv3.ListenConfig{DisableStartupMessage: true})
	}()
	t.Cleanup(func() { _ = app.ShutdownWithTimeout(10 * time.Second); <-done })
	return "http://" + ln.Addr().String()
}
