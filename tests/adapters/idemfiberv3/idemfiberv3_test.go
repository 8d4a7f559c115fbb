package idemfiberv3_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/recover"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/idemfiberv3"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/tests/adapters/internal/client"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp's process-wide Date header updater, started once.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// fasthttp's worker pool cleaner sees the stop signal only after its
		// idle-worker sleep ends; it holds nothing of ours.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"))
}

func scope(c fiber.Ctx) string { return c.Get(adaptertest.PrincipalHeader) }

func newApp(cfg ...fiber.Config) *fiber.App {
	var c fiber.Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	c.IdleTimeout = time.Second // Shutdown waits for idle keep-alive connections
	return fiber.New(c)
}

// serve runs app on a real loopback listener until the test ends.
func serve(t *testing.T, app *fiber.App) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}); err != nil {
			t.Errorf("fiber: %v", err)
		}
	}()
	t.Cleanup(func() {
		// fasthttp, like net/http, waits 5s before it counts a connection
		// that never sent a request as idle, and the client's Transport
		// leaves such connections behind (dialled for a request a pooled
		// connection then served): close the client's idle connections
		// first, and wait longer than those 5s.
		http.DefaultClient.CloseIdleConnections()
		if err := app.ShutdownWithTimeout(10 * time.Second); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		<-done
	})
	return "http://" + ln.Addr().String()
}

// mount registers the suite's http.Handler directly: Fiber v3 adapts
// net/http handlers itself (through fasthttpadaptor).
func mount(t *testing.T, m adaptertest.Mount) string {
	f := newApp()
	f.Use(recover.New(), outer)
	mw := idemfiberv3.New(m.Engine, idemfiberv3.WithScope(scope),
		idemfiberv3.WithNext(func(c fiber.Ctx) bool { return m.Skip(c.Path()) }))
	var routes fiber.Router = f
	handlers := []any{m.App}
	switch m.Where {
	case adaptertest.PerRoute:
		handlers = []any{mw, m.App}
	case adaptertest.Group:
		routes = f.Group("/g", mw)
	case adaptertest.Global:
		f.Use(mw)
	case adaptertest.Twice:
		f.Use(mw)
		routes = f.Group("/g", mw)
	case adaptertest.Nested:
		handlers = []any{mw, mw, m.App}
	}
	for _, p := range []string{"/a", "/b", "/skipped"} {
		routes.All(p, handlers[0], handlers[1:]...)
	}
	url := serve(t, f)
	if m.Where == adaptertest.Group || m.Where == adaptertest.Twice {
		url += "/g"
	}
	return url
}

// outer is the app's CORS and request-id middleware, outside idem.
func outer(c fiber.Ctx) error {
	for k, v := range adaptertest.OuterHeaders(c.Get("Origin"), c.Get("X-Request-Id")) {
		c.Set(k, v[0])
	}
	return c.Next()
}

func TestBehaviour(t *testing.T) {
	adaptertest.Run(t, adaptertest.Config{
		Mount:    mount,
		NewStore: client.NewStore,
		SkipStreaming: "Fiber v3 runs an http.Handler through fasthttpadaptor, which buffers its whole response " +
			"(Flush is a no-op); native streaming (SendStreamWriter) is the native Stream case",
		Native:           native,
		NativeVariants:   []string{"normalized", "DisableHeaderNormalizing"},
		NativeStreamGone: true,
	})
}

// native serves one of the suite's native cases written with Fiber v3's API.
func native(t *testing.T, m adaptertest.NativeMount) string {
	app := newApp(fiber.Config{DisableHeaderNormalizing: m.Variant == "DisableHeaderNormalizing"})
	app.Use(func(c fiber.Ctx) error {
		c.Set("x-request-id", c.Get("X-Request-Id"))
		return c.Next()
	})
	var h fiber.Handler
	switch m.Case {
	case adaptertest.HandlerError:
		h = func(fiber.Ctx) error { return fiber.NewError(402, "card declined") }
	case adaptertest.PlainError:
		h = func(fiber.Ctx) error { return errors.New("database gone") }
	case adaptertest.Panic:
		h = func(fiber.Ctx) error { panic("boom") }
	case adaptertest.PanicAfterWrite:
		h = func(c fiber.Ctx) error {
			// Written, not yet sent (a panic after c.End(), once sent, is
			// TestPanicAfterEnd).
			_ = c.Status(201).SendString("written")
			panic("boom")
		}
	case adaptertest.HeaderLines:
		h = func(c fiber.Ctx) error {
			hd := &c.Response().Header
			for _, l := range m.Lines {
				hd.Add(l[0], l[1])
			}
			c.Set("Content-Type", "text/plain; charset=utf-8")
			return c.Status(201).SendString("body")
		}
	case adaptertest.Stream:
		h = func(c fiber.Ctx) error {
			c.Set("Content-Type", "text/event-stream")
			c.Set("Location", "/streams/1")
			return c.Status(200).SendStreamWriter(func(w *bufio.Writer) {
				for i := 1; i <= 3; i++ {
					if i == 2 {
						<-m.Release
					}
					fmt.Fprintf(w, "data: %d\n\n", i)
					_ = w.Flush()
				}
			})
		}
	case adaptertest.HangUp:
		h = func(c fiber.Ctx) error {
			<-m.Release // fasthttp does not cancel a request's context when its client hangs up
			return c.Status(201).SendString("done after hang-up")
		}
	}
	mw := idemfiberv3.New(m.Engine, idemfiberv3.WithScope(scope))
	handler := func(c fiber.Ctx) error { m.Executed(); return h(c) }
	if m.RecoveryInside {
		app.Post("/x", mw, recover.New(), handler)
	} else {
		app.Post("/x", recover.New(), mw, handler)
	}
	return serve(t, app) + "/x"
}

// v3 trap: Ctx is itself a context.Context whose Value reads Locals, not
// c.Context(). The handler binds the body after idemfiberv3 took its
// fingerprint and finds the scoped key both ways; middleware outside
// idemfiberv3 sees the replay marker both ways.
func TestBindAndInfo(t *testing.T) {
	type seen struct{ viaCtx, viaContext idem.Info }
	outer := make(chan seen, 2)
	var runs atomic.Int64
	app := newApp()
	app.Use(func(c fiber.Ctx) error {
		err := c.Next()
		a, _ := idem.InfoFromContext(c)
		b, _ := idem.InfoFromContext(c.Context())
		outer <- seen{a, b}
		return err
	})
	app.Post("/pay", idemfiberv3.New(client.Engine(t), idemfiberv3.WithScope(scope)), func(c fiber.Ctx) error {
		runs.Add(1)
		var in struct {
			Amount int `json:"amount"`
		}
		if err := c.Bind().Body(&in); err != nil {
			return err
		}
		viaCtx, ok1 := idem.InfoFromContext(c)
		viaContext, ok2 := idem.InfoFromContext(c.Context())
		if !ok1 || !ok2 || viaCtx != viaContext {
			return fmt.Errorf("info via c: %+v %v, via c.Context(): %+v %v", viaCtx, ok1, viaContext, ok2)
		}
		return c.Status(201).JSON(fiber.Map{"amount": in.Amount, "key": viaCtx.Key})
	})
	url := serve(t, app) + "/pay"
	first := client.Post(t, url, "k1", `{"amount":42}`)
	second := client.Post(t, url, "k1", `{"amount":42}`)
	if first.Status != 201 || !regexp.MustCompile(`^\{"amount":42,"key":"[0-9a-f]{64}"\}$`).MatchString(first.Body) {
		t.Fatalf("first: %d %s; want the bound amount and a 64-hex key", first.Status, first.Body)
	}
	if second.Status != 201 || second.Body != first.Body || !second.Replayed() || runs.Load() != 1 {
		t.Fatalf("retry: %d %s replayed=%v runs=%d", second.Status, second.Body, second.Replayed(), runs.Load())
	}
	o1, o2 := <-outer, <-outer
	if o1.viaCtx.Replayed || len(o1.viaCtx.Key) != 64 || o1.viaCtx != o1.viaContext {
		t.Fatalf("outer middleware saw %+v on the first request; want the key both ways", o1)
	}
	if !o2.viaCtx.Replayed || !o2.viaContext.Replayed {
		t.Fatalf("outer middleware saw %+v on the retry; want Replayed both ways", o2)
	}
}

// fasthttp reuses request and response buffers across requests on a
// connection, and Fiber's strings alias them unless Immutable is set:
// everything recorded (events' method and route, header lines, body) must
// survive later requests that overwrite those buffers, either way.
func TestBufferReuse(t *testing.T) {
	for _, immutable := range []bool{false, true} {
		t.Run(fmt.Sprintf("immutable=%v", immutable), func(t *testing.T) {
			var mu sync.Mutex
			var events []idem.Event
			hook := idem.WithEventHook(func(_ context.Context, ev idem.Event) {
				if ev.Kind == idem.EventCompleted {
					mu.Lock()
					events = append(events, ev)
					mu.Unlock()
				}
			})
			app := newApp(fiber.Config{Immutable: immutable})
			app.Post("/echo/:id", idemfiberv3.New(client.Engine(t, hook), idemfiberv3.WithScope(scope),
				idemfiberv3.WithRoute(func(c fiber.Ctx) string { return c.Path() })), // aliases the request buffer unless Immutable
				func(c fiber.Ctx) error {
					c.Response().Header.Add("X-Echo", c.Params("id"))
					c.Response().Header.Add("X-Echo", string(c.Body()))
					return c.Status(201).Send(c.Body())
				})
			base := serve(t, app)
			ids := []string{"aaaa", "bbbb", "cccc", "dddd"}
			for _, id := range ids { // one keep-alive connection, same-sized requests
				body := strings.Repeat(id, 50)
				if got := client.Post(t, base+"/echo/"+id, "key-"+id, body); got.Status != 201 || got.Body != body {
					t.Fatalf("%s: %d %q", id, got.Status, got.Body)
				}
			}
			for _, id := range ids {
				body := strings.Repeat(id, 50)
				got := client.Post(t, base+"/echo/"+id, "key-"+id, body)
				if !got.Replayed() || got.Body != body || !reflect.DeepEqual(got.Header.Values("X-Echo"), []string{id, body}) {
					t.Fatalf("replay of %s: %q %q", id, got.Body, got.Header.Values("X-Echo"))
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(events) != len(ids) {
				t.Fatalf("%d completed events, want %d", len(events), len(ids))
			}
			for i, ev := range events {
				if ev.Method != "POST" || ev.Route != "/echo/"+ids[i] {
					t.Fatalf("event %d: %s %s, want POST /echo/%s (aliased a reused buffer)", i, ev.Method, ev.Route, ids[i])
				}
			}
		})
	}
}

// A replay's body is read in place from memstore's record; middleware
// outside idem that rewrites the response body in place (allowed: the
// buffer is the response's) must change only its own copy, never the
// record that later replays are read from: every replay is rewritten from
// the stored body. Concurrent replays of one key run under -race.
func TestReplayBodyNotShared(t *testing.T) {
	app := newApp()
	app.Use(func(c fiber.Ctx) error {
		err := c.Next()
		b := c.Response().Body()
		for i := range b {
			b[i]++ // "the" -> "uif": twice on the same bytes would give "vjg"
		}
		return err
	})
	app.Post("/x", idemfiberv3.New(client.Engine(t), idemfiberv3.WithScope(scope)), func(c fiber.Ctx) error {
		return c.Status(201).SendString("the stored body")
	})
	url := serve(t, app) + "/x"
	want := "uif!tupsfe!cpez" // "the stored body", each byte + 1
	if r := client.Post(t, url, "k", `{}`); r.Status != 201 || r.Body != want {
		t.Fatalf("first: %d %q", r.Status, r.Body)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 10 {
				if r := client.Post(t, url, "k", `{}`); r.Status != 201 || !r.Replayed() || r.Body != want {
					t.Errorf("replay: %d %q replayed=%v; want %q (the middleware's rewrite of the stored body)", r.Status, r.Body, r.Replayed(), want)
					return
				}
			}
		})
	}
	wg.Wait()
}

// A replay replaces the lines of the retry's header that it carries (an
// outer middleware's line the handler changed) without reordering the
// lines already written: fasthttp's Del moves the header's last line into
// the gap, so deleting a name after adding others' lines put the last of
// them first. Past idem.HeaderLines' capacity the record's names are
// sorted, so X-Z (outer, changed) comes after X-A and X-Pad.
func TestReplayLineOrder(t *testing.T) {
	app := newApp()
	app.Use(func(c fiber.Ctx) error {
		c.Set("X-Z", "outer")
		return c.Next()
	})
	app.Post("/x", idemfiberv3.New(client.Engine(t), idemfiberv3.WithScope(scope)), func(c fiber.Ctx) error {
		c.Set("X-Z", "handler")
		h := &c.Response().Header
		for i := range 40 {
			h.Add("X-Pad", strconv.Itoa(i))
		}
		h.Add("X-A", "1")
		h.Add("X-A", "2")
		return c.Status(201).SendString("body")
	})
	url := serve(t, app) + "/x"
	first, second := client.Post(t, url, "k", `{}`), client.Post(t, url, "k", `{}`)
	if !second.Replayed() {
		t.Fatalf("retry %d %q not replayed", second.Status, second.Body)
	}
	for _, name := range []string{"X-Pad", "X-A", "X-Z"} {
		if got, want := second.Header.Values(name), first.Header.Values(name); !reflect.DeepEqual(got, want) || len(want) == 0 {
			t.Fatalf("%s replayed as %q, sent as %q", name, got, want)
		}
	}
}

// WithNext lets chosen requests pass through without a key; the default
// route scope is the route idemfiberv3 is mounted on (its template).
func TestNextAndRoute(t *testing.T) {
	var runs atomic.Int64
	app := newApp()
	mw := idemfiberv3.New(client.Engine(t), idemfiberv3.WithScope(scope),
		idemfiberv3.WithNext(func(c fiber.Ctx) bool { return c.Get("X-Webhook") != "" }))
	app.Post("/items/:id", mw, func(c fiber.Ctx) error {
		runs.Add(1)
		return c.Status(201).SendString(c.Params("id"))
	})
	base := serve(t, app)
	req := client.NewRequest(context.Background(), base+"/items/1", "", `{}`)
	req.Header.Set("X-Webhook", "1")
	if got := client.Do(t, req); got.Status != 201 {
		t.Fatalf("skipped request without a key: %d", got.Status)
	}
	if got := client.Post(t, base+"/items/1", "", `{}`); got.Status != 400 {
		t.Fatalf("covered request without a key: %d, want 400", got.Status)
	}
	client.Post(t, base+"/items/1", "k", `{}`)
	if got := client.Post(t, base+"/items/2", "k", `{}`); got.Status != 422 {
		t.Fatalf("same key on another path of the same route template: %d, want 422 (one scope)", got.Status)
	}
	if runs.Load() != 2 {
		t.Fatalf("runs = %d, want 2", runs.Load())
	}
}
