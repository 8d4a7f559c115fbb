package idemgin_test

import (
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"regexp"
	"sync/atomic"
	"testing"

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
	adaptertest.Run(t, adaptertest.Config{Mount: mount, Native: native, NewStore: client.NewStore})
}

// native serves one of the suite's native cases written with Gin's API.
func native(t *testing.T, m adaptertest.NativeMount) string {
	r := gin.New()
	r.Use(func(c *gin.Context) { // the request id, and the app's error middleware: c.Error without a response
		c.Header("x-request-id", c.GetHeader("X-Request-Id"))
		c.Next()
		if len(c.Errors) > 0 && !c.Writer.Written() {
			c.String(500, c.Errors.Last().Error())
		}
	})
	mw := idemgin.New(m.Engine, idemgin.WithScope(scope))
	rec := gin.RecoveryWithWriter(io.Discard)
	var h gin.HandlerFunc
	switch m.Case {
	case adaptertest.HandlerError:
		h = func(c *gin.Context) { c.AbortWithStatusJSON(402, gin.H{"error": "card declined"}) }
	case adaptertest.PlainError:
		h = func(c *gin.Context) { _ = c.Error(errors.New("database gone")) }
	case adaptertest.Panic:
		h = func(*gin.Context) { panic("boom") }
	case adaptertest.PanicAfterWrite:
		h = func(c *gin.Context) {
			c.String(201, "written")
			c.Writer.Flush()
			panic("boom")
		}
	case adaptertest.HeaderLines:
		h = func(c *gin.Context) {
			hd := c.Writer.Header()
			for _, l := range m.Lines {
				hd.Add(l[0], l[1])
			}
			c.Data(201, "text/plain; charset=utf-8", []byte("body"))
		}
	case adaptertest.Stream:
		h = func(c *gin.Context) {
			c.Header("Content-Type", "text/event-stream")
			c.Header("Location", "/streams/1")
			c.Status(200)
			n := 0
			c.Stream(func(w io.Writer) bool {
				if n++; n == 2 {
					<-m.Release
				}
				fmt.Fprintf(w, "data: %d\n\n", n)
				return n < 3
			})
		}
	case adaptertest.HangUp:
		h = func(c *gin.Context) {
			<-c.Request.Context().Done()
			c.String(201, "done after hang-up")
		}
	}
	handler := func(c *gin.Context) { m.Executed(); h(c) }
	if m.RecoveryInside {
		r.POST("/x", mw, rec, handler)
	} else {
		r.POST("/x", rec, mw, handler)
	}
	return serve(t, r) + "/x"
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
