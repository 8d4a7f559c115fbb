// Package payments is the payments service of the load benchmark
// (benchmarks/cmd/load): POST /v1/payments with the contract of examples/ ({"amount": N},
// Idempotency-Key, X-User-Id), answered 201 with the payment and a
// Location, and GET /stats, the executions its ledger counted. Not for
// production.
package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
)

// Route is the payments route; StatsRoute answers the ledger's Stats.
const (
	Route      = "/v1/payments"
	StatsRoute = "/stats"
)

// Ledger is the service's state: executions per idempotency key, so that
// a run can tell how many keys a library executed twice.
type Ledger struct {
	seq        atomic.Int64
	executions atomic.Int64
	keysTwice  atomic.Int64
	byKey      sync.Map // key -> *atomic.Int32
}

// Stats is GET /stats: what the ledger saw since the service started.
type Stats struct {
	Executions int64 `json:"executions"`
	KeysTwice  int64 `json:"keys_twice"`
}

// chargeRequest is POST /v1/payments' body, as in examples/.
type chargeRequest struct {
	Amount int64 `json:"amount"`
}

// Payment is POST /v1/payments' 201 body.
type Payment struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Status string `json:"status"`
}

// Charge executes one payment for key and returns it, or an error for a
// body that is not a positive amount.
func (l *Ledger) Charge(key string, body []byte) (Payment, error) {
	var req chargeRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Amount <= 0 {
		return Payment{}, errors.New(`body must be {"amount": N} with N > 0`)
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
	return Payment{ID: "pay_" + strconv.FormatInt(l.seq.Add(1), 10), Amount: req.Amount, Status: "succeeded"}, nil
}

// Stats returns what the ledger counted so far.
func (l *Ledger) Stats() Stats {
	return Stats{Executions: l.executions.Load(), KeysTwice: l.keysTwice.Load()}
}

// GinApp is the service on Gin (release mode) with mw (none when nil) in
// front of the payments handler.
func GinApp(l *Ledger, mw gin.HandlerFunc) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	var chain []gin.HandlerFunc
	if mw != nil {
		chain = append(chain, mw)
	}
	r.POST(Route, append(chain, func(c *gin.Context) {
		body, err := c.GetRawData()
		if err != nil {
			c.Status(http.StatusBadRequest)
			return
		}
		p, err := l.Charge(c.GetHeader("Idempotency-Key"), body)
		if err != nil {
			c.String(http.StatusBadRequest, err.Error())
			return
		}
		c.Header("Location", Route+"/"+p.ID)
		c.JSON(http.StatusCreated, p)
	})...)
	r.GET(StatsRoute, func(c *gin.Context) { c.JSON(http.StatusOK, l.Stats()) })
	return r
}

// FiberApp is the service on Fiber v2 with mw (none when nil) in front of
// the payments handler.
func FiberApp(l *Ledger, mw fiber.Handler) *fiber.App {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	var chain []fiber.Handler
	if mw != nil {
		chain = append(chain, mw)
	}
	app.Post(Route, append(chain, func(c *fiber.Ctx) error {
		p, err := l.Charge(c.Get("Idempotency-Key"), c.Body())
		if err != nil {
			return c.Status(http.StatusBadRequest).SendString(err.Error())
		}
		c.Set("Location", Route+"/"+p.ID)
		return c.Status(http.StatusCreated).JSON(p)
	})...)
	app.Get(StatsRoute, func(c *fiber.Ctx) error { return c.JSON(l.Stats()) })
	return app
}

// Server is a service serving on a listener.
type Server struct {
	// URL is the service's base URL, http://<listener address>.
	URL      string
	shutdown func() error
}

// Start serves app, an http.Handler (GinApp) or a *fiber.App (FiberApp),
// on ln until Shutdown.
func Start(app any, ln net.Listener) (*Server, error) {
	url := "http://" + ln.Addr().String()
	switch app := app.(type) {
	case *fiber.App:
		go func() { _ = app.Listener(ln) }()
		return &Server{URL: url, shutdown: func() error { return app.ShutdownWithTimeout(10 * time.Second) }}, nil
	case http.Handler:
		srv := &http.Server{Handler: app, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		return &Server{URL: url, shutdown: func() error { return srv.Shutdown(context.Background()) }}, nil
	}
	return nil, fmt.Errorf("payments: cannot serve a %T", app)
}

// Shutdown stops the server gracefully (Fiber: within 10 s).
func (s *Server) Shutdown() error { return s.shutdown() }

// ListeningPrefix starts the line a service process prints on stdout once
// it serves, followed by its URL: cmd/load waits for it.
const ListeningPrefix = "listening on "
