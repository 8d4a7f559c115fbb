package benchmarks

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/adapters/idemgin"
	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
)

// executions counts handler runs, so that replay and conflict cases can
// assert that the handler did not run.
var executions atomic.Int64

// driver performs one in-process request (no network) and returns its status.
type driver interface {
	do(method, key string) int
}

// framework builds the same app on one framework: POST and GET /v1/payments
// answering a small JSON body, with idem mounted when e is not nil.
type framework struct {
	name  string
	route string // the route template idem scopes keys by
	build func(e *idem.Engine) driver
}

// frameworks is filled by the init functions of each framework's file.
var frameworks = []framework{
	{name: "nethttp", route: route, build: buildNetHTTP},
	{name: "gin", route: route, build: buildGin},
}

func handleHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	executions.Add(1)
	if keyCounts.Load() != nil {
		countKey(r.Header.Get(idem.DefaultHeader))
	}
	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodGet {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusCreated)
	}
	_, _ = w.Write(respBody)
}

func buildNetHTTP(e *idem.Engine) driver {
	var h http.Handler = http.HandlerFunc(handleHTTP)
	if e != nil {
		h = idemhttp.New(e, idemhttp.WithScope(func(*http.Request) string { return principal }))(h)
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+route, h)
	mux.Handle("GET "+route, h)
	return newHTTPDriver(mux)
}

func buildGin(e *idem.Engine) driver {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	if e != nil {
		r.Use(idemgin.New(e, idemgin.WithScope(func(*gin.Context) string { return principal })))
	}
	r.POST(route, ginHandler)
	r.GET(route, ginHandler)
	return newHTTPDriver(r)
}

func ginHandler(c *gin.Context) {
	_, _ = io.Copy(io.Discard, c.Request.Body)
	executions.Add(1)
	if keyCounts.Load() != nil {
		countKey(c.GetHeader(idem.DefaultHeader))
	}
	status := http.StatusCreated
	if c.Request.Method == http.MethodGet {
		status = http.StatusOK
	}
	c.Data(status, "application/json", respBody)
}

// httpDriver drives an http.Handler with reused requests and a fresh
// httptest.ResponseRecorder per request.
type httpDriver struct {
	h         http.Handler
	post, get *http.Request
	body      *bytes.Reader
	rc        io.ReadCloser
	keys      []string
}

func newHTTPDriver(h http.Handler) *httpDriver {
	d := &httpDriver{h: h, body: bytes.NewReader(reqBody), keys: []string{""}}
	d.rc = io.NopCloser(d.body)
	d.post = httptest.NewRequest(http.MethodPost, route, nil)
	d.post.Header.Set("Content-Type", "application/json")
	d.post.ContentLength = int64(len(reqBody))
	d.get = httptest.NewRequest(http.MethodGet, route, nil)
	for _, r := range []*http.Request{d.post, d.get} {
		r.Header.Set("X-User-Id", principal)
	}
	return d
}

func (d *httpDriver) do(method, key string) int {
	r := d.post
	if method == http.MethodGet {
		r = d.get
	}
	d.body.Reset(reqBody)
	r.Body = d.rc
	if key != "" {
		d.keys[0] = key
		r.Header[idem.DefaultHeader] = d.keys
	}
	w := httptest.NewRecorder()
	d.h.ServeHTTP(w, r)
	return w.Code
}

// BenchmarkMiddleware measures one request through each framework with a
// memory store: bare (no idem), fresh (first execution, a new key each
// op), replay, conflict (the key is held in progress: 409) and passthrough
// (GET with idem mounted), plus bare-get, the baseline of passthrough.
func BenchmarkMiddleware(b *testing.B) {
	for _, fw := range frameworks {
		b.Run("fw="+fw.name, func(b *testing.B) { benchFramework(b, fw) })
	}
}

func benchFramework(b *testing.B, fw framework) {
	b.Run("path=bare", func(b *testing.B) {
		d := fw.build(nil)
		b.ReportAllocs()
		for b.Loop() {
			if code := d.do(http.MethodPost, newKey()); code != http.StatusCreated {
				b.Fatalf("bare: %s", statusText(code))
			}
		}
	})
	b.Run("path=fresh", func(b *testing.B) {
		e, _ := newMemEngine(b)
		d := fw.build(e)
		b.ReportAllocs()
		for b.Loop() {
			if code := d.do(http.MethodPost, newKey()); code != http.StatusCreated {
				b.Fatalf("fresh: %s", statusText(code))
			}
		}
	})
	b.Run("path=replay", func(b *testing.B) {
		e, _ := newMemEngine(b)
		d := fw.build(e)
		key := newKey()
		if code := d.do(http.MethodPost, key); code != http.StatusCreated {
			b.Fatalf("first: %s", statusText(code))
		}
		before := executions.Load()
		b.ReportAllocs()
		for b.Loop() {
			if code := d.do(http.MethodPost, key); code != http.StatusCreated {
				b.Fatalf("replay: %s", statusText(code))
			}
		}
		if n := executions.Load() - before; n != 0 {
			b.Fatalf("replay ran the handler %d times", n)
		}
	})
	b.Run("path=conflict", func(b *testing.B) {
		e, s := newMemEngine(b)
		d := fw.build(e)
		key := newKey()
		// Hold the key under every route name an adapter may scope by: the
		// route template, net/http's pattern, and "/" (idemfiber mounted with
		// app.Use scopes by c.Route().Path, the mount prefix). The loop
		// below checks that the answer is 409.
		routes := []string{fw.route, "POST " + route, route, "/"}
		slices.Sort(routes)
		for _, rt := range slices.Compact(routes) {
			holdKey(b, s, http.MethodPost, rt, route, key)
		}
		before := executions.Load()
		b.ReportAllocs()
		for b.Loop() {
			if code := d.do(http.MethodPost, key); code != http.StatusConflict {
				b.Fatalf("conflict: %s", statusText(code))
			}
		}
		if n := executions.Load() - before; n != 0 {
			b.Fatalf("conflict ran the handler %d times", n)
		}
	})
	b.Run("path=bare-get", func(b *testing.B) {
		d := fw.build(nil)
		b.ReportAllocs()
		for b.Loop() {
			if code := d.do(http.MethodGet, ""); code != http.StatusOK {
				b.Fatalf("bare-get: %s", statusText(code))
			}
		}
	})
	b.Run("path=passthrough", func(b *testing.B) {
		e, _ := newMemEngine(b)
		d := fw.build(e)
		b.ReportAllocs()
		for b.Loop() {
			if code := d.do(http.MethodGet, ""); code != http.StatusOK {
				b.Fatalf("passthrough: %s", statusText(code))
			}
		}
	})
}
