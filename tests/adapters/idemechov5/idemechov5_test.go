package idemechov5_test

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/idemechov5"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/tests/adapters/internal/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func scope(c *echo.Context) string { return c.Request().Header.Get(adaptertest.PrincipalHeader) }

func newEcho() *echo.Echo {
	e := echo.New()
	e.Logger = slog.New(slog.DiscardHandler)
	return e
}

func recoverer() echo.MiddlewareFunc {
	return middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true})
}

func mount(t *testing.T, m adaptertest.Mount) string {
	r := newEcho()
	r.Use(recoverer(), outer)
	mw := idemechov5.New(m.Engine, idemechov5.WithScope(scope),
		idemechov5.WithSkipper(func(c *echo.Context) bool { return m.Skip(c.Request().URL.Path) }))
	add := r.Any
	var perRoute []echo.MiddlewareFunc
	switch m.Where {
	case adaptertest.PerRoute:
		perRoute = []echo.MiddlewareFunc{mw}
	case adaptertest.Group:
		add = r.Group("/g", mw).Any
	case adaptertest.Global:
		r.Use(mw)
	case adaptertest.Twice:
		r.Use(mw)
		add = r.Group("/g", mw).Any
	case adaptertest.Nested:
		perRoute = []echo.MiddlewareFunc{mw, mw}
	}
	for _, p := range []string{"/a", "/b", "/skipped"} {
		add(p, echo.WrapHandler(m.App), perRoute...)
	}
	url := serve(t, r)
	if m.Where == adaptertest.Group || m.Where == adaptertest.Twice {
		url += "/g"
	}
	return url
}

// outer is the app's CORS and request-id middleware, outside idem.
func outer(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		for k, v := range adaptertest.OuterHeaders(c.Request().Header.Get("Origin"), c.Request().Header.Get("X-Request-Id")) {
			c.Response().Header()[k] = v
		}
		return next(c)
	}
}

func TestBehaviour(t *testing.T) {
	adaptertest.Run(t, adaptertest.Config{Mount: mount, Native: native, NewStore: client.NewStore})
}

// native serves one of the suite's native cases written with Echo v5's API.
func native(t *testing.T, m adaptertest.NativeMount) string {
	r := newEcho()
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			c.Response().Header()["x-request-id"] = []string{c.Request().Header.Get("X-Request-Id")}
			return next(c)
		}
	})
	var h echo.HandlerFunc
	switch m.Case {
	case adaptertest.HandlerError:
		h = func(*echo.Context) error { return echo.NewHTTPError(402, "card declined") }
	case adaptertest.PlainError:
		h = func(*echo.Context) error { return errors.New("database gone") }
	case adaptertest.Panic:
		h = func(*echo.Context) error { panic("boom") }
	case adaptertest.PanicAfterWrite:
		h = func(c *echo.Context) error {
			_ = c.String(201, "written")
			_ = http.NewResponseController(c.Response()).Flush()
			panic("boom")
		}
	case adaptertest.HeaderLines:
		h = func(c *echo.Context) error {
			hd := c.Response().Header()
			for _, l := range m.Lines {
				hd.Add(l[0], l[1])
			}
			return c.Blob(201, "text/plain; charset=utf-8", []byte("body"))
		}
	case adaptertest.Stream:
		h = func(c *echo.Context) error {
			w := c.Response()
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Location", "/streams/1")
			w.WriteHeader(200)
			for i := 1; i <= 3; i++ {
				if i == 2 {
					<-m.Release
				}
				fmt.Fprintf(w, "data: %d\n\n", i)
				if err := http.NewResponseController(w).Flush(); err != nil {
					return err
				}
			}
			return nil
		}
	case adaptertest.HangUp:
		h = func(c *echo.Context) error {
			<-c.Request().Context().Done()
			return c.String(201, "done after hang-up")
		}
	}
	mw := idemechov5.New(m.Engine, idemechov5.WithScope(scope))
	handler := func(c *echo.Context) error { m.Executed(); return h(c) }
	if m.RecoveryInside {
		r.POST("/x", handler, mw, recoverer())
	} else {
		r.POST("/x", handler, recoverer(), mw)
	}
	return serve(t, r) + "/x"
}

func serve(t *testing.T, r *echo.Echo) string {
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv.URL
}

// The handler binds the body after idemechov5 took its fingerprint, and
// sees the scoped key; middleware outside idemechov5 sees the replay marker.
func TestBindAndInfo(t *testing.T) {
	outer := make(chan idem.Info, 2)
	var runs atomic.Int64
	r := newEcho()
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			err := next(c)
			info, _ := idem.InfoFromContext(c.Request().Context())
			outer <- info
			return err
		}
	})
	r.POST("/pay", func(c *echo.Context) error {
		runs.Add(1)
		var in struct {
			Amount int `json:"amount"`
		}
		if err := c.Bind(&in); err != nil {
			return err
		}
		info, _ := idem.InfoFromContext(c.Request().Context())
		return c.JSON(201, map[string]any{"amount": in.Amount, "key": info.Key})
	}, idemechov5.New(client.Engine(t), idemechov5.WithScope(scope)))
	url := serve(t, r) + "/pay"
	first := client.Post(t, url, "k1", `{"amount":42}`)
	second := client.Post(t, url, "k1", `{"amount":42}`)
	if first.Status != 201 || !regexp.MustCompile(`^\{"amount":42,"key":"[0-9a-f]{64}"\}\n$`).MatchString(first.Body) {
		t.Fatalf("first: %d %s; want the bound amount and a 64-hex key", first.Status, first.Body)
	}
	if second.Status != 201 || second.Body != first.Body || !second.Replayed() || runs.Load() != 1 {
		t.Fatalf("retry: %d %s replayed=%v runs=%d", second.Status, second.Body, second.Replayed(), runs.Load())
	}
	if o1, o2 := <-outer, <-outer; o1.Replayed || len(o1.Key) != 64 || !o2.Replayed {
		t.Fatalf("outer middleware saw %+v then %+v; want the key, then Replayed", o1, o2)
	}
}

// A returned echo.HTTPError is written by the error handler inside the
// middleware and stored; a plain error becomes a 500 and is released. The
// app's error handler runs once per error (as under v4's idemecho); outer
// middleware finds the error with HandledError; the client gets the body
// once.
//
// That a returned HTTPError is stored and a plain error released is also the
// suite's native HandlerError and PlainError; this test adds what only
// idemechov5 promises: HandledError and one call of the error handler.
func TestHandledError(t *testing.T) {
	var runs, handled atomic.Int64
	outerErrs := make(chan [2]error, 10)
	r := newEcho()
	errorHandler := echo.DefaultHTTPErrorHandler(false)
	r.HTTPErrorHandler = func(c *echo.Context, err error) {
		handled.Add(1)
		errorHandler(c, err)
	}
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			err := next(c)
			outerErrs <- [2]error{err, idemechov5.HandledError(c)}
			return err
		}
	})
	mw := idemechov5.New(client.Engine(t), idemechov5.WithScope(scope))
	r.POST("/http-error", func(*echo.Context) error {
		runs.Add(1)
		return echo.NewHTTPError(402, "card declined")
	}, mw)
	r.POST("/plain-error", func(*echo.Context) error {
		runs.Add(1)
		return errors.New("database gone")
	}, mw)
	base := serve(t, r)

	first := client.Post(t, base+"/http-error", "k", `{}`)
	second := client.Post(t, base+"/http-error", "k", `{}`)
	if first.Status != 402 || first.Body != "{\"message\":\"card declined\"}\n" {
		t.Fatalf("HTTPError 402: %d %q; want the error handler's body once", first.Status, first.Body)
	}
	if second.Status != 402 || second.Body != first.Body || !second.Replayed() || runs.Load() != 1 {
		t.Fatalf("retry of a 402: %d %q replayed=%v runs=%d", second.Status, second.Body, second.Replayed(), runs.Load())
	}
	if e := <-outerErrs; e[0] != nil || e[1] == nil || !strings.Contains(e[1].Error(), "card declined") {
		t.Fatalf("outer middleware got %v, HandledError %v; want nil and the handler's error", e[0], e[1])
	}
	if e := <-outerErrs; e[0] != nil || e[1] != nil {
		t.Fatalf("outer middleware got %v, HandledError %v on the replay; want nil, nil", e[0], e[1])
	}

	for i := 0; i < 2; i++ {
		got := client.Post(t, base+"/plain-error", "k", `{}`)
		if got.Status != 500 || got.Replayed() || got.Body != "{\"message\":\"Internal Server Error\"}\n" {
			t.Fatalf("plain error try %d: %d %q replayed=%v", i, got.Status, got.Body, got.Replayed())
		}
	}
	if runs.Load() != 3 {
		t.Fatalf("runs = %d, want the plain error to run twice", runs.Load())
	}
	if handled.Load() != 3 {
		t.Fatalf("the app's error handler ran %d times for 3 handler errors; want once each", handled.Load())
	}
}

// v5's c.JSON holds the status back until the first body byte, so that an
// encoding failure is answered by the error handler: idem records that
// answer (a 500, released), never the 201 the handler asked for.
func TestJSONEncodingFailure(t *testing.T) {
	var runs atomic.Int64
	r := newEcho()
	r.POST("/x", func(c *echo.Context) error {
		runs.Add(1)
		return c.JSON(201, map[string]any{"unencodable": make(chan int)})
	}, idemechov5.New(client.Engine(t), idemechov5.WithScope(scope)))
	url := serve(t, r) + "/x"
	for i := 0; i < 2; i++ {
		if got := client.Post(t, url, "k", `{}`); got.Status != 500 || got.Replayed() {
			t.Fatalf("try %d: %d %q replayed=%v; want the error handler's 500", i, got.Status, got.Body, got.Replayed())
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("runs = %d, want the failed encoding released and run again", runs.Load())
	}
}

// v5 trap: c.Response() is an http.ResponseWriter and handlers reach the
// *echo.Response with echo.UnwrapResponse, e.g. to write to it directly:
// those writes are recorded too, and Committed stays true for them.
func TestUnwrappedResponseWrites(t *testing.T) {
	var runs atomic.Int64
	committed := make(chan bool, 1)
	r := newEcho()
	r.POST("/x", func(c *echo.Context) error {
		runs.Add(1)
		res, err := echo.UnwrapResponse(c.Response())
		if err != nil {
			return err
		}
		res.Header().Set("Content-Type", "text/plain")
		res.WriteHeader(202)
		_, _ = res.Write([]byte("written to *echo.Response"))
		committed <- res.Committed
		return nil
	}, idemechov5.New(client.Engine(t), idemechov5.WithScope(scope)))
	url := serve(t, r) + "/x"
	first := client.Post(t, url, "k", `{}`)
	if !<-committed {
		t.Fatal("*echo.Response not committed after WriteHeader")
	}
	second := client.Post(t, url, "k", `{}`)
	if first.Status != 202 || second.Status != 202 || second.Body != "written to *echo.Response" || !second.Replayed() || runs.Load() != 1 {
		t.Fatalf("first %d %q, retry %d %q replayed=%v runs=%d", first.Status, first.Body, second.Status, second.Body, second.Replayed(), runs.Load())
	}
}

// WithSkipper lets chosen requests pass through without a key.
func TestSkipper(t *testing.T) {
	r := newEcho()
	skip := func(c *echo.Context) bool { return c.Path() == "/webhook" }
	r.Use(idemechov5.New(client.Engine(t), idemechov5.WithScope(scope), idemechov5.WithSkipper(skip)))
	h := func(c *echo.Context) error { return c.String(201, "ok") }
	r.POST("/webhook", h)
	r.POST("/pay", h)
	base := serve(t, r)
	if got := client.Post(t, base+"/webhook", "", `{}`); got.Status != 201 {
		t.Fatalf("skipped route without a key: %d", got.Status)
	}
	if got := client.Post(t, base+"/pay", "", `{}`); got.Status != 400 {
		t.Fatalf("covered route without a key: %d, want 400", got.Status)
	}
}

// hidden is a writer without Unwrap: echo.UnwrapResponse can't see through it.
type hidden struct{ http.ResponseWriter }

// An outer middleware that hides the *echo.Response behind its own writer
// still gets its response recorded: the capture then goes on top.
func TestHiddenResponse(t *testing.T) {
	var runs atomic.Int64
	r := newEcho()
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			c.SetResponse(hidden{c.Response()})
			return next(c)
		}
	})
	r.POST("/x", func(c *echo.Context) error {
		runs.Add(1)
		return c.String(201, "through a hidden writer")
	}, idemechov5.New(client.Engine(t), idemechov5.WithScope(scope)))
	url := serve(t, r) + "/x"
	first := client.Post(t, url, "k", `{}`)
	second := client.Post(t, url, "k", `{}`)
	if first.Status != 201 || second.Status != 201 || second.Body != first.Body || !second.Replayed() || runs.Load() != 1 {
		t.Fatalf("first %d %q, retry %d %q replayed=%v runs=%d", first.Status, first.Body, second.Status, second.Body, second.Replayed(), runs.Load())
	}
}
