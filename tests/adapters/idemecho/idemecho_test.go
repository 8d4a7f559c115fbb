package idemecho_test

import (
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/idemecho"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/tests/adapters/internal/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func scope(c echo.Context) string { return c.Request().Header.Get(adaptertest.PrincipalHeader) }

func newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	return e
}

func recoverer() echo.MiddlewareFunc {
	return middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true})
}

func mount(t *testing.T, m adaptertest.Mount) string {
	r := newEcho()
	r.Use(recoverer(), outer)
	mw := idemecho.New(m.Engine, idemecho.WithScope(scope),
		idemecho.WithSkipper(func(c echo.Context) bool { return m.Skip(c.Request().URL.Path) }))
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
	return func(c echo.Context) error {
		for k, v := range adaptertest.OuterHeaders(c.Request().Header.Get("Origin"), c.Request().Header.Get("X-Request-Id")) {
			c.Response().Header()[k] = v
		}
		return next(c)
	}
}

func TestBehaviour(t *testing.T) {
	adaptertest.Run(t, adaptertest.Config{Mount: mount, Native: native, NewStore: client.NewStore})
}

// native serves one of the suite's native cases written with Echo's API.
func native(t *testing.T, m adaptertest.NativeMount) string {
	r := newEcho()
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Response().Header()["x-request-id"] = []string{c.Request().Header.Get("X-Request-Id")}
			return next(c)
		}
	})
	var h echo.HandlerFunc
	switch m.Case {
	case adaptertest.HandlerError:
		h = func(echo.Context) error { return echo.NewHTTPError(402, "card declined") }
	case adaptertest.PlainError:
		h = func(echo.Context) error { return errors.New("database gone") }
	case adaptertest.Panic:
		h = func(echo.Context) error { panic("boom") }
	case adaptertest.PanicAfterWrite:
		h = func(c echo.Context) error {
			_ = c.String(201, "written")
			c.Response().Flush()
			panic("boom")
		}
	case adaptertest.HeaderLines:
		h = func(c echo.Context) error {
			hd := c.Response().Header()
			for _, l := range m.Lines {
				hd.Add(l[0], l[1])
			}
			return c.Blob(201, "text/plain; charset=utf-8", []byte("body"))
		}
	case adaptertest.Stream:
		h = func(c echo.Context) error {
			res := c.Response()
			res.Header().Set("Content-Type", "text/event-stream")
			res.Header().Set("Location", "/streams/1")
			res.WriteHeader(200)
			for i := 1; i <= 3; i++ {
				if i == 2 {
					<-m.Release
				}
				fmt.Fprintf(res, "data: %d\n\n", i)
				res.Flush()
			}
			return nil
		}
	case adaptertest.HangUp:
		h = func(c echo.Context) error {
			<-c.Request().Context().Done()
			return c.String(201, "done after hang-up")
		}
	}
	mw := idemecho.New(m.Engine, idemecho.WithScope(scope))
	handler := func(c echo.Context) error { m.Executed(); return h(c) }
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

// The handler binds the body after idemecho took its fingerprint, and sees
// the scoped key; middleware outside idemecho sees the replay marker.
func TestBindAndInfo(t *testing.T) {
	outer := make(chan idem.Info, 2)
	var runs atomic.Int64
	r := newEcho()
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			info, _ := idem.InfoFromContext(c.Request().Context())
			outer <- info
			return err
		}
	})
	r.POST("/pay", func(c echo.Context) error {
		runs.Add(1)
		var in struct {
			Amount int `json:"amount"`
		}
		if err := c.Bind(&in); err != nil {
			return err
		}
		info, _ := idem.InfoFromContext(c.Request().Context())
		return c.JSON(201, map[string]any{"amount": in.Amount, "key": info.Key})
	}, idemecho.New(client.Engine(t), idemecho.WithScope(scope)))
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

// The app's error handler runs once per returned error (as under Echo's
// Logger middleware): outer middleware finds the error with HandledError,
// and the client gets the body once. (That a returned HTTPError is stored
// and a plain error released is the suite's native HandlerError and
// PlainError.)
func TestHandledError(t *testing.T) {
	var runs, handled atomic.Int64
	outerErrs := make(chan error, 10)
	r := newEcho()
	r.HTTPErrorHandler = func(err error, c echo.Context) {
		handled.Add(1)
		r.DefaultHTTPErrorHandler(err, c)
	}
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			if err != nil {
				t.Errorf("idemecho returned %v after handling it", err)
			}
			outerErrs <- idemecho.HandledError(c)
			return err
		}
	})
	mw := idemecho.New(client.Engine(t), idemecho.WithScope(scope))
	r.POST("/http-error", func(c echo.Context) error {
		runs.Add(1)
		return echo.NewHTTPError(402, "card declined")
	}, mw)
	r.POST("/plain-error", func(c echo.Context) error {
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
	if err := <-outerErrs; err == nil || !strings.Contains(err.Error(), "card declined") {
		t.Fatalf("outer middleware saw %v, want the handler's error", err)
	}
	if err := <-outerErrs; err != nil { // the replay
		t.Fatalf("outer middleware saw %v for a replay", err)
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

// WithSkipper lets chosen requests pass through without a key.
func TestSkipper(t *testing.T) {
	r := newEcho()
	skip := func(c echo.Context) bool { return c.Path() == "/webhook" }
	r.Use(idemecho.New(client.Engine(t), idemecho.WithScope(scope), idemecho.WithSkipper(skip)))
	h := func(c echo.Context) error { return c.String(201, "ok") }
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
