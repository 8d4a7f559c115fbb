package idemfiber_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
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

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/idemfiber"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/tests/adapters/internal/client"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp's process-wide Date header updater, started once.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// fasthttp's worker pool cleaner sees the stop signal only after its
		// idle-worker sleep (10s) ends; it holds nothing of ours.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"))
}

func scope(c *fiber.Ctx) string { return c.Get(adaptertest.PrincipalHeader) }

func newApp(cfg ...fiber.Config) *fiber.App {
	c := fiber.Config{DisableStartupMessage: true}
	if len(cfg) > 0 {
		c = cfg[0]
		c.DisableStartupMessage = true
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
		if err := app.Listener(ln); err != nil {
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

func mount(t *testing.T, m adaptertest.Mount) string {
	f := newApp()
	f.Use(recover.New(), outer)
	mw := idemfiber.New(m.Engine, idemfiber.WithScope(scope),
		idemfiber.WithNext(func(c *fiber.Ctx) bool { return m.Skip(c.Path()) }))
	var routes fiber.Router = f
	var perRoute []fiber.Handler
	switch m.Where {
	case adaptertest.PerRoute:
		perRoute = []fiber.Handler{mw}
	case adaptertest.Group:
		routes = f.Group("/g", mw)
	case adaptertest.Global:
		f.Use(mw)
	case adaptertest.Twice:
		f.Use(mw)
		routes = f.Group("/g", mw)
	case adaptertest.Nested:
		perRoute = []fiber.Handler{mw, mw}
	}
	for _, p := range []string{"/a", "/b", "/skipped"} {
		routes.All(p, append(perRoute[:len(perRoute):len(perRoute)], adaptor.HTTPHandler(m.App))...)
	}
	url := serve(t, f)
	if m.Where == adaptertest.Group || m.Where == adaptertest.Twice {
		url += "/g"
	}
	return url
}

// outer is the app's CORS and request-id middleware, outside idem.
func outer(c *fiber.Ctx) error {
	for k, v := range adaptertest.OuterHeaders(c.Get("Origin"), c.Get("X-Request-Id")) {
		c.Set(k, v[0])
	}
	return c.Next()
}

func TestBehaviour(t *testing.T) {
	adaptertest.Run(t, adaptertest.Config{
		Mount:    mount,
		NewStore: client.NewStore,
		SkipStreaming: "fiber's adaptor (fasthttpadaptor) buffers an http.Handler's whole response: its Flush is a no-op; " +
			"native streaming is tested in TestStreaming",
	})
}

// The handler parses the body after idemfiber took its fingerprint, and
// sees the scoped key; middleware outside idemfiber sees the replay marker.
func TestBodyParserAndInfo(t *testing.T) {
	outer := make(chan idem.Info, 2)
	var runs atomic.Int64
	app := newApp()
	app.Use(func(c *fiber.Ctx) error {
		err := c.Next()
		info, _ := idem.InfoFromContext(c.UserContext())
		outer <- info
		return err
	})
	app.Post("/pay", idemfiber.New(client.Engine(t), idemfiber.WithScope(scope)), func(c *fiber.Ctx) error {
		runs.Add(1)
		var in struct {
			Amount int `json:"amount"`
		}
		if err := c.BodyParser(&in); err != nil {
			return err
		}
		info, _ := idem.InfoFromContext(c.UserContext())
		return c.Status(201).JSON(fiber.Map{"amount": in.Amount, "key": info.Key})
	})
	url := serve(t, app) + "/pay"
	first := client.Post(t, url, "k1", `{"amount":42}`)
	second := client.Post(t, url, "k1", `{"amount":42}`)
	if first.Status != 201 || !regexp.MustCompile(`^\{"amount":42,"key":"[0-9a-f]{64}"\}$`).MatchString(first.Body) {
		t.Fatalf("first: %d %s; want the parsed amount and a 64-hex key", first.Status, first.Body)
	}
	if second.Status != 201 || second.Body != first.Body || !second.Replayed() || runs.Load() != 1 {
		t.Fatalf("retry: %d %s replayed=%v runs=%d", second.Status, second.Body, second.Replayed(), runs.Load())
	}
	if o1, o2 := <-outer, <-outer; o1.Replayed || len(o1.Key) != 64 || !o2.Replayed {
		t.Fatalf("outer middleware saw %+v then %+v; want the key, then Replayed", o1, o2)
	}
}

// fasthttp reuses request and response buffers across requests on a
// connection: everything recorded (events' method and route, header lines,
// body) must survive later requests that overwrite those buffers.
func TestBufferReuse(t *testing.T) {
	var mu sync.Mutex
	var events []idem.Event
	hook := idem.WithEventHook(func(_ context.Context, ev idem.Event) {
		if ev.Kind == idem.EventCompleted {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		}
	})
	app := newApp()
	app.Post("/echo/:id", idemfiber.New(client.Engine(t, hook), idemfiber.WithScope(scope),
		idemfiber.WithRoute(func(c *fiber.Ctx) string { return c.Path() })), // aliases the request buffer
		func(c *fiber.Ctx) error {
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
}

// A returned fiber.Error is written by the app's error handler inside the
// middleware and stored; a plain error becomes a 500 and is released.
func TestReturnedErrors(t *testing.T) {
	var runs atomic.Int64
	app := newApp()
	mw := idemfiber.New(client.Engine(t), idemfiber.WithScope(scope))
	app.Post("/fiber-error", mw, func(c *fiber.Ctx) error {
		runs.Add(1)
		return fiber.NewError(402, "card declined")
	})
	app.Post("/plain-error", mw, func(c *fiber.Ctx) error {
		runs.Add(1)
		return errors.New("database gone")
	})
	base := serve(t, app)
	first := client.Post(t, base+"/fiber-error", "k", `{}`)
	second := client.Post(t, base+"/fiber-error", "k", `{}`)
	if first.Status != 402 || first.Body != "card declined" {
		t.Fatalf("fiber.NewError(402): %d %q", first.Status, first.Body)
	}
	if second.Status != 402 || second.Body != first.Body || !second.Replayed() || runs.Load() != 1 {
		t.Fatalf("retry of a 402: %d %q replayed=%v runs=%d", second.Status, second.Body, second.Replayed(), runs.Load())
	}
	for i := 0; i < 2; i++ {
		if got := client.Post(t, base+"/plain-error", "k", `{}`); got.Status != 500 || got.Body != "database gone" || got.Replayed() {
			t.Fatalf("plain error try %d: %d %q replayed=%v", i, got.Status, got.Body, got.Replayed())
		}
	}
	if runs.Load() != 3 {
		t.Fatalf("runs = %d, want the plain error to run twice", runs.Load())
	}
}

// A panic releases the key and reaches the recover middleware, mounted
// before or after idemfiber.
func TestPanicRecoveryOrder(t *testing.T) {
	for _, order := range []string{"recover-before-idem", "recover-after-idem"} {
		t.Run(order, func(t *testing.T) {
			var runs atomic.Int64
			handler := func(c *fiber.Ctx) error {
				if runs.Add(1) <= 2 {
					panic("boom")
				}
				return c.Status(201).SendString("ok")
			}
			app := newApp()
			mw := idemfiber.New(client.Engine(t), idemfiber.WithScope(scope))
			if order == "recover-before-idem" {
				app.Post("/x", recover.New(), mw, handler)
			} else {
				app.Post("/x", mw, recover.New(), handler)
			}
			url := serve(t, app) + "/x"
			for i := 0; i < 2; i++ {
				if got := client.Post(t, url, "k", `{}`); got.Status != 500 || got.Body != "boom" {
					t.Fatalf("panic %d: %d %q, want 500 from recover", i, got.Status, got.Body)
				}
			}
			if got := client.Post(t, url, "k", `{}`); got.Status != 201 || got.Replayed() || runs.Load() != 3 {
				t.Fatalf("after two panics: %d replayed=%v runs=%d; want a third execution", got.Status, got.Replayed(), runs.Load())
			}
		})
	}
}

// Multiple header lines, commas inside values and their order are replayed
// exactly, also with DisableHeaderNormalizing (lower-case key header
// name and response header names as set), with few lines and with more
// than idem.HeaderLines holds. The outer middleware's request id, set
// lower case, belongs to each exchange: the replay carries the retry's.
func TestHeaderLines(t *testing.T) {
	for _, normalize := range []bool{true, false} {
		for _, pad := range []int{0, 40} {
			t.Run(fmt.Sprintf("normalize=%v/pad=%d", normalize, pad), func(t *testing.T) {
				app := newApp(fiber.Config{DisableHeaderNormalizing: !normalize})
				app.Use(func(c *fiber.Ctx) error {
					c.Set("x-request-id", c.Get("X-Request-Id"))
					return c.Next()
				})
				app.Post("/x", idemfiber.New(client.Engine(t), idemfiber.WithScope(scope)), func(c *fiber.Ctx) error {
					h := &c.Response().Header
					h.Add("Link", `</a>; rel="next", </b>; rel="prev"`)
					h.Add("x-lower-case", ",")
					h.Add("Link", `</c>; rel="last"`)
					h.Add("idempotent-replayed", "false")
					for i := range pad {
						h.Add("x-pad", strconv.Itoa(i))
					}
					c.Set("Content-Type", "text/plain; charset=utf-8")
					return c.Status(201).SendString("body")
				})
				url := serve(t, app) + "/x"
				send := func(id string) client.Reply {
					req := client.NewRequest(context.Background(), url, "", `{}`)
					req.Header["idempotency-key"] = []string{"k"} // sent as is, lower case
					req.Header.Set("X-Request-Id", id)
					return client.Do(t, req)
				}
				first, second := send("r1"), send("r2")
				if first.Status != 201 || !second.Replayed() || second.Body != "body" {
					t.Fatalf("first %d %q, retry %d %q replayed=%v", first.Status, first.Body, second.Status, second.Body, second.Replayed())
				}
				for _, name := range []string{"Link", "X-Lower-Case", "Content-Type", "X-Pad"} {
					if !reflect.DeepEqual(second.Header.Values(name), first.Header.Values(name)) || len(first.Header.Values(name)) == 0 && name != "X-Pad" {
						t.Fatalf("%s replayed as %q, sent as %q", name, second.Header.Values(name), first.Header.Values(name))
					}
				}
				if got := second.Header.Values("Link"); len(got) != 2 || got[0] != `</a>; rel="next", </b>; rel="prev"` {
					t.Fatalf("Link lines = %q", got)
				}
				if got := second.Header.Values("X-Request-Id"); !reflect.DeepEqual(got, []string{"r2"}) {
					t.Fatalf("replay's request id lines = %q, want the retry's [r2]", got)
				}
				if got := second.Header.Values(idem.ReplayedHeader); !reflect.DeepEqual(got, []string{"true"}) {
					t.Fatalf("replay marker lines = %q, want [true]", got)
				}
			})
		}
	}
}

// A replay's body is read in place from memstore's record; middleware
// outside idem that rewrites the response body in place (allowed: the
// buffer is the response's) must change only its own copy, never the
// record that later replays are read from: every replay is rewritten from
// the stored body. Concurrent replays of one key run under -race.
func TestReplayBodyNotShared(t *testing.T) {
	app := newApp()
	app.Use(func(c *fiber.Ctx) error {
		err := c.Next()
		b := c.Response().Body()
		for i := range b {
			b[i]++ // "the" -> "uif": twice on the same bytes would give "vjg"
		}
		return err
	})
	app.Post("/x", idemfiber.New(client.Engine(t), idemfiber.WithScope(scope)), func(c *fiber.Ctx) error {
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
	app.Use(func(c *fiber.Ctx) error {
		c.Set("X-Z", "outer")
		return c.Next()
	})
	app.Post("/x", idemfiber.New(client.Engine(t), idemfiber.WithScope(scope)), func(c *fiber.Ctx) error {
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

// A body stream reaches the client before the handler's stream writer ends;
// it can't be captured, so every retry, during or after the stream, gets
// 410 response-not-stored with the original status and Location, never a
// second execution.
func TestStreaming(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	var runs atomic.Int64
	app := newApp()
	app.Post("/events", idemfiber.New(client.Engine(t), idemfiber.WithScope(scope)), func(c *fiber.Ctx) error {
		runs.Add(1)
		c.Set("Content-Type", "text/event-stream")
		c.Set("Location", "/streams/1")
		c.Status(200).Context().SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := 1; i <= 3; i++ {
				if i == 2 {
					<-release
				}
				fmt.Fprintf(w, "data: %d\n\n", i)
				_ = w.Flush()
			}
		})
		return nil
	})
	url := serve(t, app) + "/events"
	t.Cleanup(done) // runs before the app's shutdown, so a failing test doesn't hang
	resp, err := http.DefaultClient.Do(client.NewRequest(context.Background(), url, "s", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: 1\n" {
		t.Fatalf("first event before the stream ended: %q %v", line, err)
	}
	check := func(when string) {
		got := client.Post(t, url, "s", `{}`)
		var p idem.Problem
		_ = json.Unmarshal([]byte(got.Body), &p)
		if got.Status != 410 || !got.Replayed() || p.Type != idem.ProblemTypeBase+"response-not-stored" ||
			p.OriginalStatus != 200 || got.Header.Get("Location") != "/streams/1" {
			t.Fatalf("retry %s the stream: %d %s Location %q; want 410 response-not-stored for a 200", when, got.Status, got.Body, got.Header.Get("Location"))
		}
	}
	check("during")
	done()
	rest, _ := io.ReadAll(br)
	if full := "data: 1\n" + string(rest); full != "data: 1\n\ndata: 2\n\ndata: 3\n\n" {
		t.Fatalf("stream = %q", full)
	}
	check("after")
	if runs.Load() != 1 {
		t.Fatalf("runs = %d, want 1", runs.Load())
	}
}

// WithNext lets chosen requests pass through without a key; the default
// route scope is the route idemfiber is mounted on (its template).
func TestNextAndRoute(t *testing.T) {
	var runs atomic.Int64
	app := newApp()
	mw := idemfiber.New(client.Engine(t), idemfiber.WithScope(scope),
		idemfiber.WithNext(func(c *fiber.Ctx) bool { return c.Get("X-Webhook") != "" }))
	app.Post("/items/:id", mw, func(c *fiber.Ctx) error {
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

// unitStore is a Transactional memstore whose units count completions.
type unitStore struct {
	idem.Store
	completed atomic.Int64
}

type countingUnit struct {
	s          *unitStore
	key, token string
}

func (s *unitStore) Unit(key, token string) idem.Unit { return &countingUnit{s, key, token} }

func (u *countingUnit) Complete(ctx context.Context, resp []byte, retention time.Duration) error {
	u.s.completed.Add(1)
	return u.s.Store.Complete(ctx, u.key, u.token, resp, retention)
}

func (u *countingUnit) Release(ctx context.Context) error {
	return u.s.Store.Release(ctx, u.key, u.token)
}

// TestTransactionalUnit: a native handler finds its execution's idem.Unit
// in c.UserContext() (where pgstore.Tx looks), and the engine completes
// through it. (adaptertest's App runs behind fiber's net/http adaptor,
// which does not carry the user context.)
func TestTransactionalUnit(t *testing.T) {
	store := &unitStore{Store: client.NewStore(t)}
	e, err := idem.New(store, idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	app := newApp()
	var sawUnit atomic.Bool
	app.Post("/pay", idemfiber.New(e, idemfiber.WithScope(scope)), func(c *fiber.Ctx) error {
		sawUnit.Store(idem.UnitFromContext(c.UserContext()) != nil)
		return c.SendStatus(201)
	})
	if r := client.Post(t, serve(t, app)+"/pay", "k1", `{}`); r.Status != 201 {
		t.Fatalf("status %d", r.Status)
	}
	if !sawUnit.Load() || store.completed.Load() != 1 {
		t.Fatalf("handler saw a unit: %v; completions through it: %d; want true, 1", sawUnit.Load(), store.completed.Load())
	}
}
