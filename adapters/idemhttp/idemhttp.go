// Package idemhttp is the net/http adapter of idem: middleware of the shape
// func(http.Handler) http.Handler for net/http, chi and any router built on
// http.Handler. It translates requests and responses; every decision is the
// [idem.Engine]'s.
//
//	e, err := idem.New(store)
//	mux.Handle("POST /v1/payments", idemhttp.New(e, idemhttp.WithScope(userID))(payments))
package idemhttp

import (
	"net/http"
	"strings"

	idem "github.com/idemkit/idem/core"
)

// Option configures the middleware.
type Option func(*config)

type config struct {
	scope func(*http.Request) string
	route func(*http.Request) string
}

// WithScope sets the function returning the authenticated principal of a
// request (user, account or API client id), read from what the app's own
// authentication middleware stored in the request context; it is part of the
// key's scope. An empty result is answered with 401 unless the engine has
// idem.WithGlobalScope. Required unless the engine uses idem.WithGlobalScope.
func WithScope(fn func(*http.Request) string) Option { return func(c *config) { c.scope = fn } }

// WithRoute sets the function returning the route template of a request,
// part of the key's scope. Optional. Default is r.Pattern without its method
// ("POST /v1/payments" → "/v1/payments", as Gin, Echo and Fiber name routes),
// set by http.ServeMux for the handler it routes to (Go 1.23+); the engine
// falls back to r.URL.Path when it is empty.
func WithRoute(fn func(*http.Request) string) Option { return func(c *config) { c.route = fn } }

// New returns middleware that runs each request covered by e (POST and
// PATCH by default) at most once per idempotency key and replays the stored
// response to duplicates. A panic in next releases the key and is re-raised
// for the server's or the app's recovery.
func New(e *idem.Engine, opts ...Option) func(http.Handler) http.Handler {
	c := config{route: route}
	for _, o := range opts {
		o(&c)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			principal := ""
			if c.scope != nil && e.Covers(r.Method) {
				principal = c.scope(r)
			}
			x, resp := e.BeginHTTP(r, c.route(r), principal)
			if resp != nil {
				resp.Send(w)
				return
			}
			if x == nil { // not covered, or fail-open
				next.ServeHTTP(w, r)
				return
			}
			cw := x.NewCaptureWriter(w)
			defer func() {
				if p := recover(); p != nil {
					x.Abort(cw.Status(), w.Header())
					panic(p)
				}
			}()
			next.ServeHTTP(cw, r.WithContext(x.WithInfo(r.Context())))
			x.Finish(cw.Status(), w.Header())
		})
	}
}

func route(r *http.Request) string {
	if _, path, ok := strings.Cut(r.Pattern, " "); ok {
		return path
	}
	return r.Pattern
}
