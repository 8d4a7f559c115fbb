package idemgin_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/idemgin"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode)
	goleak.VerifyTestMain(m)
}

func newStore(t *testing.T) idem.Store {
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	return s
}

func scope(c *gin.Context) string { return c.GetHeader(adaptertest.PrincipalHeader) }

func mount(t *testing.T, m adaptertest.Mount) string {
	r := gin.New()
	r.Use(gin.RecoveryWithWriter(io.Discard), outer)
	mw := idemgin.New(m.Engine, idemgin.WithScope(scope),
		idemgin.WithSkipper(func(c *gin.Context) bool { return m.Skip(c.Request.URL.Path) }))
	routes := gin.IRoutes(r)
	var handlers []gin.HandlerFunc
	switch m.Where {
	case adaptertest.PerRoute:
		handlers = []gin.HandlerFunc{mw}
	case adaptertest.Group:
		routes = r.Group("/g", mw)
	case adaptertest.Global:
		r.Use(mw)
	}
	for _, p := range []string{"/a", "/b", "/skipped"} {
		routes.Any(p, append(handlers[:len(handlers):len(handlers)], gin.WrapH(m.App))...)
	}
	url := serve(t, r)
	if m.Where == adaptertest.Group {
		url += "/g"
	}
	return url
}

// outer is the app's CORS and request-id middleware, outside idem.
func outer(c *gin.Context) {
	for k, v := range adaptertest.OuterHeaders(c.GetHeader("Origin"), c.GetHeader("X-Request-Id")) {
		c.Writer.Header()[k] = v
	}
}

func TestBehaviour(t *testing.T) {
	adaptertest.Run(t, adaptertest.Config{Mount: mount, NewStore: newStore})
}

// serve runs r over a real listener with an engine on a fresh memstore.
func serve(t *testing.T, r *gin.Engine) string {
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv.URL
}

func engine(t *testing.T, opts ...idem.Option) *idem.Engine {
	opts = append([]idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	e, err := idem.New(newStore(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, key, body string) reply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(adaptertest.PrincipalHeader, "alice")
	req.Header.Set(idem.DefaultHeader, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func replayed(r reply) bool { return r.header.Get(idem.ReplayedHeader) == "true" }

// The handler binds the body after idemgin took its fingerprint, and sees
// the scoped key; middleware outside idemgin sees the replay marker.
func TestBindAndInfo(t *testing.T) {
	outer := make(chan idem.Info, 2)
	var runs atomic.Int64
	r := gin.New()
	r.Use(func(c *gin.Context) {
		c.Next()
		info, _ := idem.InfoFromContext(c.Request.Context())
		outer <- info
	})
	r.POST("/pay", idemgin.New(engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
		runs.Add(1)
		var in struct{ Amount int }
		if err := c.ShouldBindJSON(&in); err != nil {
			c.String(400, "bind: %v", err)
			return
		}
		info, _ := idem.InfoFromContext(c.Request.Context())
		c.JSON(201, gin.H{"amount": in.Amount, "key": info.Key})
	})
	url := serve(t, r) + "/pay"
	first := post(t, url, "k1", `{"amount":42}`)
	second := post(t, url, "k1", `{"amount":42}`)
	if first.status != 201 || !regexp.MustCompile(`^\{"amount":42,"key":"[0-9a-f]{64}"\}$`).MatchString(first.body) {
		t.Fatalf("first: %d %s; want the bound amount and a 64-hex key", first.status, first.body)
	}
	if second.status != 201 || second.body != first.body || !replayed(second) || runs.Load() != 1 {
		t.Fatalf("retry: %d %s replayed=%v runs=%d", second.status, second.body, replayed(second), runs.Load())
	}
	if o1, o2 := <-outer, <-outer; o1.Replayed || len(o1.Key) != 64 || !o2.Replayed {
		t.Fatalf("outer middleware saw %+v then %+v; want the key, then Replayed", o1, o2)
	}
}

// Abort* is recorded by its status: 500 releases, 402 is stored.
func TestAbort(t *testing.T) {
	var runs atomic.Int64
	r := gin.New()
	r.POST("/:status", idemgin.New(engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
		runs.Add(1)
		if c.Param("status") == "500" {
			c.AbortWithStatus(500)
			return
		}
		c.AbortWithStatusJSON(402, gin.H{"error": "card declined", "run": runs.Load()})
	})
	base := serve(t, r)
	for i := 0; i < 2; i++ {
		if got := post(t, base+"/500", "k", `{}`); got.status != 500 || replayed(got) {
			t.Fatalf("AbortWithStatus(500) try %d: %d replayed=%v", i, got.status, replayed(got))
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("AbortWithStatus(500) ran %d times, want 2 (released)", runs.Load())
	}
	first := post(t, base+"/402", "k", `{}`)
	second := post(t, base+"/402", "k", `{}`)
	if first.status != 402 || second.status != 402 || second.body != first.body || !replayed(second) || runs.Load() != 3 {
		t.Fatalf("AbortWithStatusJSON(402): %d %s then %d %s; runs %d", first.status, first.body, second.status, second.body, runs.Load())
	}
}

// A handler that only calls c.Error, answered by an error middleware outside
// idemgin, is released: a retry runs again instead of replaying an empty 200.
func TestErrorWithoutResponse(t *testing.T) {
	var runs atomic.Int64
	r := gin.New()
	r.Use(func(c *gin.Context) {
		c.Next()
		if len(c.Errors) > 0 && !c.Writer.Written() {
			c.JSON(503, gin.H{"error": c.Errors.Last().Error()})
		}
	})
	r.POST("/x", idemgin.New(engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
		if runs.Add(1) == 1 {
			_ = c.Error(errors.New("downstream down"))
			return
		}
		c.String(201, "ok")
	})
	url := serve(t, r) + "/x"
	if got := post(t, url, "k", `{}`); got.status != 503 || !strings.Contains(got.body, "downstream down") {
		t.Fatalf("first: %d %s; want the error middleware's 503", got.status, got.body)
	}
	if got := post(t, url, "k", `{}`); got.status != 201 || got.body != "ok" || replayed(got) {
		t.Fatalf("retry: %d %q replayed=%v; want a second execution", got.status, got.body, replayed(got))
	}
	if got := post(t, url, "k", `{}`); got.status != 201 || !replayed(got) || runs.Load() != 2 {
		t.Fatalf("third: %d replayed=%v runs=%d", got.status, replayed(got), runs.Load())
	}
}

// A panic releases the key and reaches gin.Recovery, mounted before or after
// idemgin.
func TestPanicRecoveryOrder(t *testing.T) {
	for _, order := range []string{"recovery-before-idem", "recovery-after-idem"} {
		t.Run(order, func(t *testing.T) {
			var runs atomic.Int64
			handler := func(c *gin.Context) {
				if runs.Add(1) <= 2 {
					panic("boom")
				}
				c.String(201, "ok")
			}
			r := gin.New()
			mw := idemgin.New(engine(t), idemgin.WithScope(scope))
			rec := gin.RecoveryWithWriter(io.Discard)
			if order == "recovery-before-idem" {
				r.POST("/x", rec, mw, handler)
			} else {
				r.POST("/x", mw, rec, handler)
			}
			url := serve(t, r) + "/x"
			for i := 0; i < 2; i++ {
				if got := post(t, url, "k", `{}`); got.status != 500 {
					t.Fatalf("panic %d: status %d, want 500 from gin.Recovery", i, got.status)
				}
			}
			if got := post(t, url, "k", `{}`); got.status != 201 || replayed(got) || runs.Load() != 3 {
				t.Fatalf("after two panics: %d replayed=%v runs=%d; want a third execution", got.status, replayed(got), runs.Load())
			}
		})
	}
}

// Multiple header lines, commas inside values and their order are replayed
// exactly.
func TestHeaderLines(t *testing.T) {
	r := gin.New()
	r.POST("/x", idemgin.New(engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
		h := c.Writer.Header()
		h.Add("Link", `</a>; rel="next", </b>; rel="prev"`)
		h.Add("Link", `</c>; rel="last"`)
		h.Add("X-Empty-Comma", ",")
		c.Data(201, "text/plain; charset=utf-8", []byte("body"))
	})
	url := serve(t, r) + "/x"
	first := post(t, url, "k", `{}`)
	second := post(t, url, "k", `{}`)
	if !replayed(second) || second.body != "body" {
		t.Fatalf("retry: %d %q replayed=%v", second.status, second.body, replayed(second))
	}
	for _, name := range []string{"Link", "X-Empty-Comma", "Content-Type"} {
		if !reflect.DeepEqual(second.header.Values(name), first.header.Values(name)) || len(first.header.Values(name)) == 0 {
			t.Fatalf("%s replayed as %q, sent as %q", name, second.header.Values(name), first.header.Values(name))
		}
	}
	if got := second.header.Values("Link"); len(got) != 2 {
		t.Fatalf("Link lines = %q, want 2", got)
	}
}

// c.Stream reaches the client before the handler ends; a retry during the
// stream gets 409, one after it the whole stream.
func TestStreaming(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	var runs atomic.Int64
	r := gin.New()
	r.POST("/events", idemgin.New(engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
		runs.Add(1)
		c.Header("Content-Type", "text/event-stream")
		c.Status(200)
		n := 0
		c.Stream(func(w io.Writer) bool {
			n++
			if n == 2 {
				<-release
			}
			fmt.Fprintf(w, "data: %d\n\n", n)
			return n < 3
		})
	})
	url := serve(t, r) + "/events"
	t.Cleanup(done) // runs before the server's Close, so a failing test doesn't hang
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(adaptertest.PrincipalHeader, "alice")
	req.Header.Set(idem.DefaultHeader, "s")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: 1\n" {
		t.Fatalf("first event before the handler ended: %q %v", line, err)
	}
	if got := post(t, url, "s", `{}`); got.status != 409 {
		t.Fatalf("retry during the stream: %d %s, want 409", got.status, got.body)
	}
	done()
	rest, _ := io.ReadAll(br)
	full := "data: 1\n" + string(rest)
	if full != "data: 1\n\ndata: 2\n\ndata: 3\n\n" {
		t.Fatalf("stream = %q", full)
	}
	got := post(t, url, "s", `{}`)
	if got.status != 200 || got.body != full || !replayed(got) || got.header.Get("Content-Type") != "text/event-stream" || runs.Load() != 1 {
		t.Fatalf("retry after the stream: %d %q %q runs=%d; want the whole stream replayed", got.status, got.body, got.header.Get("Content-Type"), runs.Load())
	}
}

// The handler's context is cancelled when the client hangs up (net/http);
// the response is still recorded and replayed.
func TestClientGoneCancelsHandlerContext(t *testing.T) {
	cancelled := make(chan struct{})
	var runs atomic.Int64
	r := gin.New()
	r.POST("/x", idemgin.New(engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
		runs.Add(1)
		<-c.Request.Context().Done()
		close(cancelled)
		c.String(201, "done after hang-up")
	})
	url := serve(t, r) + "/x"
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(adaptertest.PrincipalHeader, "alice")
	req.Header.Set(idem.DefaultHeader, "gone")
	go func() { // hang up once the handler runs (not on a timer a loaded machine can beat)
		for deadline := time.Now().Add(20 * time.Second); runs.Load() == 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		}
		cancel()
	}()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("want the client to give up")
	}
	<-cancelled
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := post(t, url, "gone", `{}`)
		if got.status == 201 && replayed(got) && got.body == "done after hang-up" {
			break
		}
		if got.status != 409 || time.Now().After(deadline) {
			t.Fatalf("retry: %d %q; want 409 then the replay", got.status, got.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if runs.Load() != 1 {
		t.Fatalf("runs = %d", runs.Load())
	}
}
