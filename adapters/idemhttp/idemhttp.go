// Package idemhttp is the net/http adapter of idem: middleware of the shape
// func(http.Handler) http.Handler for net/http, chi and any router built on
// http.Handler. It translates requests and responses; every decision is the
// [idem.Engine]'s.
//
//	e, err := idem.New(store)
//	mux.Handle("POST /v1/payments", idemhttp.New(e, idemhttp.WithScope(userID))(payments))
//
// Mount it per route (above), or around a whole *http.ServeMux
// (idempotent(mux)): it then asks the mux which pattern a request matches,
// so requests no pattern matches pass through untouched (404 and 405 stay),
// and WithSkip exempts routes such as webhooks. Response header lines set
// before idemhttp runs (CORS, request ids) belong to each exchange and are
// never stored or replayed.
package idemhttp

import (
	"net/http"
	"strings"

	idem "github.com/idemkit/idem/core"
)

// Option configures the middleware.
type Option func(*config)

type config struct {
	scope       func(*http.Request) string
	route       func(*http.Request) string
	customRoute bool
	skip        func(*http.Request) bool
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
func WithRoute(fn func(*http.Request) string) Option {
	return func(c *config) { c.route, c.customRoute = fn, true }
}

// WithSkip sets a predicate that, returning true, lets a request pass
// through untouched, e.g. a webhook under a protected prefix (the
// counterpart of Echo's Skipper and Fiber's Next). Optional. Default is nil
// (skip nothing); methods the engine does not cover always pass through.
func WithSkip(fn func(*http.Request) bool) Option { return func(c *config) { c.skip = fn } }

// New returns middleware that runs each request covered by e (POST and
// PATCH by default) at most once per idempotency key and replays the stored
// response to duplicates. A panic in next releases the key and is re-raised
// for the server's or the app's recovery. When next is an *http.ServeMux,
// requests it would not route to a pattern pass through untouched, and the
// route scope is the pattern it would pick. New panics without WithScope
// unless e has idem.WithGlobalScope.
func New(e *idem.Engine, opts ...Option) func(http.Handler) http.Handler {
	c := config{route: route}
	for _, o := range opts {
		o(&c)
	}
	e.MustHaveScope(c.scope != nil, "idemhttp.WithScope")
	return func(next http.Handler) http.Handler {
		mux, _ := next.(*http.ServeMux)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !e.Covers(r.Method) || c.skip != nil && c.skip(r) {
				next.ServeHTTP(w, r)
				return
			}
			rt := ""
			if mux != nil { // mounted around the router: route as it will
				_, pattern := mux.Handler(r)
				if pattern == "" { // no route: 404, 405 or a redirect, none of idem's business
					next.ServeHTTP(w, r)
					return
				}
				rt = trimMethod(pattern)
			}
			if mux == nil || c.customRoute {
				rt = c.route(r)
			}
			principal := ""
			if c.scope != nil {
				principal = c.scope(r)
			}
			x, resp := e.BeginHTTP(r, rt, principal)
			if resp != nil {
				resp.Send(w)
				return
			}
			if x == nil { // not covered, or fail-open
				next.ServeHTTP(w, r)
				return
			}
			x.OuterHeader(w.Header())
			cw, xr := x.Capture(w, r)
			defer func() {
				if p := recover(); p != nil {
					x.Abort(cw.Status(), w.Header())
					panic(p)
				}
			}()
			next.ServeHTTP(cw, xr)
			x.Finish(cw.Status(), w.Header())
		})
	}
}

func route(r *http.Request) string { return trimMethod(r.Pattern) }

// trimMethod returns a ServeMux pattern without its method: "POST /v1/x" → "/v1/x".
func trimMethod(pattern string) string {
	if _, path, ok := strings.Cut(pattern, " "); ok {
		return path
	}
	return pattern
}
