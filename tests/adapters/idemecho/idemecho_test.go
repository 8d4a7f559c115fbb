package idemecho_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	adaptertest.Run(t, adaptertest.Config{Mount: mount, NewStore: client.NewStore})
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

// A returned echo.HTTPError is written by the error handler inside the
// middleware and stored; a plain error becomes a 500 and is released. The
// app's error handler runs once per error (as under Echo's Logger
// middleware); outer middleware finds the error with HandledError; the
// client gets the body once.
func TestReturnedErrors(t *testing.T) {
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

// A panic releases the key and reaches middleware.Recover, mounted before or
// after idemecho.
func TestPanicRecoveryOrder(t *testing.T) {
	for _, order := range []string{"recover-before-idem", "recover-after-idem"} {
		t.Run(order, func(t *testing.T) {
			var runs atomic.Int64
			handler := func(c echo.Context) error {
				if runs.Add(1) <= 2 {
					panic("boom")
				}
				return c.String(201, "ok")
			}
			r := newEcho()
			mw := idemecho.New(client.Engine(t), idemecho.WithScope(scope))
			if order == "recover-before-idem" {
				r.POST("/x", handler, recoverer(), mw)
			} else {
				r.POST("/x", handler, mw, recoverer())
			}
			url := serve(t, r) + "/x"
			for i := 0; i < 2; i++ {
				if got := client.Post(t, url, "k", `{}`); got.Status != 500 {
					t.Fatalf("panic %d: status %d, want 500 from middleware.Recover", i, got.Status)
				}
			}
			if got := client.Post(t, url, "k", `{}`); got.Status != 201 || got.Replayed() || runs.Load() != 3 {
				t.Fatalf("after two panics: %d replayed=%v runs=%d; want a third execution", got.Status, got.Replayed(), runs.Load())
			}
		})
	}
}

// Multiple header lines, commas inside values and their order are replayed
// exactly.
func TestHeaderLines(t *testing.T) {
	r := newEcho()
	r.POST("/x", func(c echo.Context) error {
		h := c.Response().Header()
		h.Add("Link", `</a>; rel="next", </b>; rel="prev"`)
		h.Add("Link", `</c>; rel="last"`)
		h.Add("X-Empty-Comma", ",")
		return c.Blob(201, "text/plain; charset=utf-8", []byte("body"))
	}, idemecho.New(client.Engine(t), idemecho.WithScope(scope)))
	url := serve(t, r) + "/x"
	first := client.Post(t, url, "k", `{}`)
	second := client.Post(t, url, "k", `{}`)
	if !second.Replayed() || second.Body != "body" {
		t.Fatalf("retry: %d %q replayed=%v", second.Status, second.Body, second.Replayed())
	}
	for _, name := range []string{"Link", "X-Empty-Comma", "Content-Type"} {
		if !reflect.DeepEqual(second.Header.Values(name), first.Header.Values(name)) || len(first.Header.Values(name)) == 0 {
			t.Fatalf("%s replayed as %q, sent as %q", name, second.Header.Values(name), first.Header.Values(name))
		}
	}
	if got := second.Header.Values("Link"); len(got) != 2 {
		t.Fatalf("Link lines = %q, want 2", got)
	}
}

// Flushed events reach the client before the handler ends; a retry during
// the stream gets 409, one after it the whole stream.
func TestStreaming(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	var runs atomic.Int64
	r := newEcho()
	r.POST("/events", func(c echo.Context) error {
		runs.Add(1)
		res := c.Response()
		res.Header().Set("Content-Type", "text/event-stream")
		res.WriteHeader(200)
		for i := 1; i <= 3; i++ {
			if i == 2 {
				<-release
			}
			fmt.Fprintf(res, "data: %d\n\n", i)
			res.Flush()
		}
		return nil
	}, idemecho.New(client.Engine(t), idemecho.WithScope(scope)))
	url := serve(t, r) + "/events"
	t.Cleanup(done) // runs before the server's Close, so a failing test doesn't hang
	resp, err := http.DefaultClient.Do(client.NewRequest(context.Background(), url, "s", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: 1\n" {
		t.Fatalf("first event before the handler ended: %q %v", line, err)
	}
	if got := client.Post(t, url, "s", `{}`); got.Status != 409 {
		t.Fatalf("retry during the stream: %d %s, want 409", got.Status, got.Body)
	}
	done()
	rest, _ := io.ReadAll(br)
	full := "data: 1\n" + string(rest)
	if full != "data: 1\n\ndata: 2\n\ndata: 3\n\n" {
		t.Fatalf("stream = %q", full)
	}
	got := client.Post(t, url, "s", `{}`)
	if got.Status != 200 || got.Body != full || !got.Replayed() || got.Header.Get("Content-Type") != "text/event-stream" || runs.Load() != 1 {
		t.Fatalf("retry after the stream: %d %q %q runs=%d; want the whole stream replayed", got.Status, got.Body, got.Header.Get("Content-Type"), runs.Load())
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

// The handler's context is cancelled when the client hangs up (net/http);
// the response is still recorded and replayed.
func TestClientGoneCancelsHandlerContext(t *testing.T) {
	cancelled := make(chan struct{})
	var runs atomic.Int64
	r := newEcho()
	r.POST("/x", func(c echo.Context) error {
		runs.Add(1)
		<-c.Request().Context().Done()
		close(cancelled)
		return c.String(201, "done after hang-up")
	}, idemecho.New(client.Engine(t), idemecho.WithScope(scope)))
	url := serve(t, r) + "/x"
	ctx, cancel := context.WithCancel(context.Background())
	go func() { // hang up once the handler runs (not on a timer a loaded machine can beat)
		for deadline := time.Now().Add(20 * time.Second); runs.Load() == 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		}
		cancel()
	}()
	if _, err := http.DefaultClient.Do(client.NewRequest(ctx, url, "gone", `{}`)); err == nil {
		t.Fatal("want the client to give up")
	}
	<-cancelled
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := client.Post(t, url, "gone", `{}`)
		if got.Status == 201 && got.Replayed() && got.Body == "done after hang-up" {
			break
		}
		if got.Status != 409 || time.Now().After(deadline) {
			t.Fatalf("retry: %d %q; want 409 then the replay", got.Status, got.Body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if runs.Load() != 1 {
		t.Fatalf("runs = %d", runs.Load())
	}
}
