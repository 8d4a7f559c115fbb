package benchmarks

import (
	"net/http"
	"slices"
	"testing"

	"github.com/idemkit/idem/benchmarks/internal/harness"
	idem "github.com/idemkit/idem/core"
)

// executions counts handler runs (harness.Executions), so that replay and
// conflict cases can assert that the handler did not run.
var executions = &harness.Executions

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

func buildNetHTTP(e *idem.Engine) driver {
	if e == nil {
		return newHTTPDriver(harness.NetHTTPApp(nil))
	}
	return newHTTPDriver(harness.NetHTTPApp(harness.IdemHTTP(e)))
}

func buildGin(e *idem.Engine) driver {
	if e == nil {
		return newHTTPDriver(harness.GinApp(nil))
	}
	return newHTTPDriver(harness.GinApp(harness.IdemGin(e)))
}

// httpDriver drives an http.Handler in process (harness.HTTPDriver).
type httpDriver struct{ *harness.HTTPDriver }

func newHTTPDriver(h http.Handler) httpDriver { return httpDriver{harness.NewHTTPDriver(h)} }

func (d httpDriver) do(method, key string) int { return d.Do(method, key) }

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
