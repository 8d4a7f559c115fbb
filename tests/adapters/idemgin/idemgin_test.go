package idemgin_test

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

	"github.com/gin-gonic/gin"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/idemgin"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/tests/adapters/internal/client"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode)
	goleak.VerifyTestMain(m)
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
	case adaptertest.Twice:
		r.Use(mw)
		routes = r.Group("/g", mw)
	case adaptertest.Nested:
		handlers = []gin.HandlerFunc{mw, mw}
	}
	for _, p := range []string{"/a", "/b", "/skipped"} {
		routes.Any(p, append(handlers[:len(handlers):len(handlers)], gin.WrapH(m.App))...)
	}
	url := serve(t, r)
	if m.Where == adaptertest.Group || m.Where == adaptertest.Twice {
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
	adaptertest.Run(t, adaptertest.Config{Mount: mount, NewStore: client.NewStore})
}

// serve runs r over a real listener with an engine on a fresh memstore.
func serve(t *testing.T, r *gin.Engine) string {
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv.URL
}

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
	r.POST("/pay", idemgin.New(client.Engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
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
	first := client.Post(t, url, "k1", `{"amount":42}`)
	second := client.Post(t, url, "k1", `{"amount":42}`)
	if first.Status != 201 || !regexp.MustCompile(`^\{"amount":42,"key":"[0-9a-f]{64}"\}$`).MatchString(first.Body) {
		t.Fatalf("first: %d %s; want the bound amount and a 64-hex key", first.Status, first.Body)
	}
	if second.Status != 201 || second.Body != first.Body || !second.Replayed() || runs.Load() != 1 {
		t.Fatalf("retry: %d %s replayed=%v runs=%d", second.Status, second.Body, second.Replayed(), runs.Load())
	}
	if o1, o2 := <-outer, <-outer; o1.Replayed || len(o1.Key) != 64 || !o2.Replayed {
		t.Fatalf("outer middleware saw %+v then %+v; want the key, then Replayed", o1, o2)
	}
}

// Abort* is recorded by its status: 500 releases, 402 is stored.
func TestAbort(t *testing.T) {
	var runs atomic.Int64
	r := gin.New()
	r.POST("/:status", idemgin.New(client.Engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
		runs.Add(1)
		if c.Param("status") == "500" {
			c.AbortWithStatus(500)
			return
		}
		c.AbortWithStatusJSON(402, gin.H{"error": "card declined", "run": runs.Load()})
	})
	base := serve(t, r)
	for i := 0; i < 2; i++ {
		if got := client.Post(t, base+"/500", "k", `{}`); got.Status != 500 || got.Replayed() {
			t.Fatalf("AbortWithStatus(500) try %d: %d replayed=%v", i, got.Status, got.Replayed())
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("AbortWithStatus(500) ran %d times, want 2 (released)", runs.Load())
	}
	first := client.Post(t, base+"/402", "k", `{}`)
	second := client.Post(t, base+"/402", "k", `{}`)
	if first.Status != 402 || second.Status != 402 || second.Body != first.Body || !second.Replayed() || runs.Load() != 3 {
		t.Fatalf("AbortWithStatusJSON(402): %d %s then %d %s; runs %d", first.Status, first.Body, second.Status, second.Body, runs.Load())
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
	r.POST("/x", idemgin.New(client.Engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
		if runs.Add(1) == 1 {
			_ = c.Error(errors.New("downstream down"))
			return
		}
		c.String(201, "ok")
	})
	url := serve(t, r) + "/x"
	if got := client.Post(t, url, "k", `{}`); got.Status != 503 || !strings.Contains(got.Body, "downstream down") {
		t.Fatalf("first: %d %s; want the error middleware's 503", got.Status, got.Body)
	}
	if got := client.Post(t, url, "k", `{}`); got.Status != 201 || got.Body != "ok" || got.Replayed() {
		t.Fatalf("retry: %d %q replayed=%v; want a second execution", got.Status, got.Body, got.Replayed())
	}
	if got := client.Post(t, url, "k", `{}`); got.Status != 201 || !got.Replayed() || runs.Load() != 2 {
		t.Fatalf("third: %d replayed=%v runs=%d", got.Status, got.Replayed(), runs.Load())
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
			mw := idemgin.New(client.Engine(t), idemgin.WithScope(scope))
			rec := gin.RecoveryWithWriter(io.Discard)
			if order == "recovery-before-idem" {
				r.POST("/x", rec, mw, handler)
			} else {
				r.POST("/x", mw, rec, handler)
			}
			url := serve(t, r) + "/x"
			for i := 0; i < 2; i++ {
				if got := client.Post(t, url, "k", `{}`); got.Status != 500 {
					t.Fatalf("panic %d: status %d, want 500 from gin.Recovery", i, got.Status)
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
	r := gin.New()
	r.POST("/x", idemgin.New(client.Engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
		h := c.Writer.Header()
		h.Add("Link", `</a>; rel="next", </b>; rel="prev"`)
		h.Add("Link", `</c>; rel="last"`)
		h.Add("X-Empty-Comma", ",")
		c.Data(201, "text/plain; charset=utf-8", []byte("body"))
	})
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

// c.Stream reaches the client before the handler ends; a retry during the
// stream gets 409, one after it the whole stream.
func TestStreaming(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	var runs atomic.Int64
	r := gin.New()
	r.POST("/events", idemgin.New(client.Engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
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

// The handler's context is cancelled when the client hangs up (net/http);
// the response is still recorded and replayed.
func TestClientGoneCancelsHandlerContext(t *testing.T) {
	cancelled := make(chan struct{})
	var runs atomic.Int64
	r := gin.New()
	r.POST("/x", idemgin.New(client.Engine(t), idemgin.WithScope(scope)), func(c *gin.Context) {
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
