// Package idemecho is the Echo (v4) adapter of idem: an echo.MiddlewareFunc
// that runs each request covered by an [idem.Engine] (POST and PATCH by
// default) at most once per idempotency key and replays the stored response
// to duplicates. It only translates between Echo and the engine; every
// decision (key syntax, scope, status policy, limits) is the engine's.
//
//	e, err := idem.New(store)
//	api := app.Group("/v1", auth) // auth sets "user_id"
//	api.Use(idemecho.New(e, idemecho.WithScope(func(c echo.Context) string {
//		s, _ := c.Get("user_id").(string)
//		return s
//	})))
//
// Mount it after authentication, so that the scope function can read the
// principal. Handlers find the scoped key with
// idem.InfoFromContext(c.Request().Context()); on a replay, middleware outside
// idemecho sees idem.Info{Replayed: true} there.
//
// Mount it per route, on a group or with e.Use: requests no route matched
// (Echo's 404 and 405, a group's catch-all) pass through untouched, and
// WithSkipper exempts routes such as webhooks. Response header lines set
// before idemecho runs (CORS, request ids) belong to each exchange and are
// never stored or replayed.
//
// What is recorded is what the client got: c.Response().Status, the response
// header lines and every body byte written. Echo turns a handler's returned
// error into a response only after the middleware chain, so idemecho calls
// the app's error handler itself (c.Error(err)) before recording: an
// echo.NewHTTPError(402, ...) is stored and replayed as written, a plain
// error becomes the error handler's 500 and the key is released. The error
// is then handled, so idemecho returns nil, as Echo's Logger middleware
// does after calling c.Error: the app's HTTPErrorHandler (and the error
// reporter in it) runs once per error. Outer middleware reads the error
// with HandledError. If the error handler writes nothing, the key is
// released and the error is returned for the outer chain to answer. A panic
// releases the key and is re-raised, so middleware.Recover answers it
// whether mounted before or after idemecho.
//
// Streaming (c.Response().Flush(), text/event-stream) is passed straight
// through to the client, never held back; the bytes are also captured, so a
// retry after the stream ended gets the whole stream replayed, a retry
// during it gets 409 (or waits, with idem.WithWait). A stream longer than
// the engine's MaxResponseBytes is answered on retry with 410
// "response-not-stored".
package idemecho

import (
	"reflect"
	"sync"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	idem "github.com/idemkit/idem/core"
)

// Option configures the middleware.
type Option func(*config)

type config struct {
	scope   func(echo.Context) string
	route   func(echo.Context) string
	skipper middleware.Skipper
}

// WithScope sets the function returning the authenticated principal of a
// request (user, account or API client id), e.g. from c.Get("user_id") as
// set by the app's authentication middleware; it is part of the key's scope.
// An empty result is answered with 401 unless the engine has
// idem.WithGlobalScope. Required unless the engine uses idem.WithGlobalScope.
func WithScope(fn func(echo.Context) string) Option { return func(c *config) { c.scope = fn } }

// WithRoute sets the function returning the route template of a request,
// part of the key's scope. Optional. Default is c.Path() (the matched route,
// e.g. "/v1/payments/:id"), else the request path when no route matched.
func WithRoute(fn func(echo.Context) string) Option { return func(c *config) { c.route = fn } }

// WithSkipper sets a function that, returning true, lets a request pass
// through untouched, e.g. a webhook in a protected group (Echo's Skipper
// idiom). Optional. Default is middleware.DefaultSkipper (skip nothing);
// methods the engine does not cover and requests no route matched always
// pass through.
func WithSkipper(s middleware.Skipper) Option { return func(c *config) { c.skipper = s } }

// handledErrorKey is the echo.Context key of HandledError.
const handledErrorKey = "idemecho.handled-error"

// HandledError returns the error a handler returned that idemecho passed
// to the app's error handler (and therefore did not return), or nil: for
// outer middleware that logs errors.
func HandledError(c echo.Context) error {
	err, _ := c.Get(handledErrorKey).(error)
	return err
}

// New returns Echo middleware enforcing idempotency keys with e. It panics
// without WithScope unless e has idem.WithGlobalScope.
func New(e *idem.Engine, opts ...Option) echo.MiddlewareFunc {
	cfg := config{skipper: middleware.DefaultSkipper, route: func(c echo.Context) string {
		if p := c.Path(); p != "" {
			return p
		}
		return c.Request().URL.Path
	}}
	for _, o := range opts {
		o(&cfg)
	}
	e.MustHaveScope(cfg.scope != nil, "idemecho.WithScope")
	var routes routeSets
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if !e.Covers(r.Method) || !routes.matched(c) || cfg.skipper(c) {
				return next(c)
			}
			principal := ""
			if cfg.scope != nil {
				principal = cfg.scope(c)
			}
			x, resp := e.BeginHTTP(r, cfg.route(c), principal)
			if resp != nil {
				if resp.IsReplay() {
					c.SetRequest(idem.RequestWithInfo(r, idem.Info{Replayed: true}))
				}
				resp.Send(c.Response())
				return nil
			}
			if x == nil { // fail-open
				return next(c)
			}
			res := c.Response()
			x.OuterHeader(res.Header())
			w := res.Writer
			cw, xr := x.Capture(w, r)
			c.SetRequest(xr)
			res.Writer = cw
			defer func() {
				res.Writer = w
				if p := recover(); p != nil {
					sent := 0
					if res.Committed {
						sent = res.Status
					}
					x.Abort(sent, res.Header())
					panic(p)
				}
			}()
			err := next(c)
			if err == nil {
				x.Finish(res.Status, res.Header())
				return nil
			}
			c.Error(err) // write the error response now, so it is recorded
			if !res.Committed {
				x.Fail() // an error without a response
				return err
			}
			x.Finish(res.Status, res.Header())
			c.Set(handledErrorKey, err)
			return nil // handled: the app's error handler runs once
		}
	}
}

// routeKey is a route as Echo registers it.
type routeKey struct{ method, path string }

// routeSets caches, per Echo instance, the routes of all its routers.
type routeSets struct{ m sync.Map } // *echo.Echo → map[routeKey]bool

var (
	notFound         = reflect.ValueOf(echo.NotFoundHandler).Pointer()
	methodNotAllowed = reflect.ValueOf(echo.MethodNotAllowedHandler).Pointer()
)

// matched reports whether Echo's router matched a route for the request's
// method: false only on evidence of a miss (Echo's 404 or 405 handler, or a
// RouteNotFound route such as the catch-all Echo adds for group
// middleware), so an unknown case stays protected.
func (rs *routeSets) matched(c echo.Context) bool {
	e := c.Echo()
	method, path := c.Request().Method, c.Path()
	v, ok := rs.m.Load(e)
	if ok && v.(map[routeKey]bool)[routeKey{method, path}] {
		return true
	}
	if h := reflect.ValueOf(c.Handler()).Pointer(); h == notFound || h == methodNotAllowed {
		return false
	}
	if !ok || !v.(map[routeKey]bool)[routeKey{echo.RouteNotFound, path}] {
		v = rs.load(e) // first request, or routes added since
	}
	set := v.(map[routeKey]bool)
	return set[routeKey{method, path}] || !set[routeKey{echo.RouteNotFound, path}]
}

func (rs *routeSets) load(e *echo.Echo) map[routeKey]bool {
	set := make(map[routeKey]bool)
	add := func(r *echo.Router) {
		for _, rt := range r.Routes() {
			set[routeKey{rt.Method, rt.Path}] = true
		}
	}
	add(e.Router())
	for _, r := range e.Routers() {
		add(r)
	}
	rs.m.Store(e, set)
	return set
}
