package idemechov5

import (
	"net/http"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"

	idem "github.com/idemkit/idem/core"
)

// Option configures the middleware.
type Option func(*config)

type config struct {
	scope   func(*echo.Context) string
	route   func(*echo.Context) string
	skipper middleware.Skipper
}

// WithScope sets the function returning the authenticated principal of a
// request (user, account or API client id), e.g. from c.Get("user_id") as
// set by the app's authentication middleware; it is part of the key's scope.
// An empty result is answered with 401 unless the engine has
// idem.WithGlobalScope. Required unless the engine uses idem.WithGlobalScope.
func WithScope(fn func(*echo.Context) string) Option { return func(c *config) { c.scope = fn } }

// WithRoute sets the function returning the route template of a request,
// part of the key's scope. Optional. Default is c.Path() (the matched route,
// e.g. "/v1/payments/:id"), else the request path when no route matched.
func WithRoute(fn func(*echo.Context) string) Option { return func(c *config) { c.route = fn } }

// WithSkipper sets a function that, returning true, lets a request pass
// through untouched, e.g. a webhook in a protected group (Echo's Skipper
// idiom). Optional. Default is middleware.DefaultSkipper (skip nothing);
// methods the engine does not cover and requests no route matched always
// pass through.
func WithSkipper(s middleware.Skipper) Option { return func(c *config) { c.skipper = s } }

// handledErrorKey is the echo.Context key of HandledError.
const handledErrorKey = "idemechov5.handled-error"

// HandledError returns the error a handler returned that idemechov5 passed
// to the app's error handler (and therefore did not return), or nil: for
// outer middleware that logs errors.
func HandledError(c *echo.Context) error {
	err, _ := c.Get(handledErrorKey).(error)
	return err
}

// New returns Echo v5 middleware enforcing idempotency keys with e. It
// panics without WithScope unless e has idem.WithGlobalScope.
func New(e *idem.Engine, opts ...Option) echo.MiddlewareFunc {
	cfg := config{skipper: middleware.DefaultSkipper, route: func(c *echo.Context) string {
		if p := c.Path(); p != "" {
			return p
		}
		return c.Request().URL.Path
	}}
	for _, o := range opts {
		o(&cfg)
	}
	e.MustHaveScope(cfg.scope != nil, "idemechov5.WithScope")
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			r := c.Request()
			if !e.Covers(r.Method) || !matched(c) || cfg.skipper(c) {
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
			x.OuterHeader(c.Response().Header())
			// The capture goes beneath *echo.Response, so that it also sees
			// handlers writing to echo.UnwrapResponse(c.Response()); on top
			// when an outer middleware hid the *echo.Response.
			res, _ := echo.UnwrapResponse(c.Response())
			var prev http.ResponseWriter
			var cw *idem.CaptureWriter
			var xr *http.Request
			if res != nil {
				prev = res.ResponseWriter
				cw, xr = x.Capture(prev, r)
				res.ResponseWriter = cw
			} else {
				prev = c.Response()
				cw, xr = x.Capture(prev, r)
				c.SetResponse(cw)
			}
			c.SetRequest(xr)
			defer func() {
				if res != nil {
					res.ResponseWriter = prev
				} else {
					c.SetResponse(prev)
				}
				if p := recover(); p != nil {
					x.Abort(cw.Status(), cw.Header())
					panic(p)
				}
			}()
			err := next(c)
			if err == nil {
				x.Finish(cw.Status(), cw.Header())
				return nil
			}
			c.Echo().HTTPErrorHandler(c, err) // write the error response now, so it is recorded
			if cw.Status() == 0 {
				x.Fail() // an error without a response
				return err
			}
			x.Finish(cw.Status(), cw.Header())
			c.Set(handledErrorKey, err)
			return nil // handled: the app's error handler runs once
		}
	}
}

// matched reports whether Echo's router matched a route for the request:
// false for its 404 and 405 answers and for RouteNotFound routes, such as
// the catch-all Echo adds for group middleware. v5 names them in the
// RouteInfo (v4's adapter has to compare handlers).
func matched(c *echo.Context) bool {
	ri := c.RouteInfo()
	return ri.Method != echo.RouteNotFound && ri.Name != echo.NotFoundRouteName && ri.Name != echo.MethodNotAllowedRouteName
}
