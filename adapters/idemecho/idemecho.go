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
// What is recorded is what the client got: c.Response().Status, the response
// header lines and every body byte written. Echo turns a handler's returned
// error into a response only after the middleware chain, so idemecho calls
// the app's error handler itself (c.Error(err)) before recording: an
// echo.NewHTTPError(402, ...) is stored and replayed as written, a plain
// error becomes the error handler's 500 and the key is released. The error
// is then still returned, as Echo's RequestLogger (HandleError) does, so
// outer middleware can log it; Echo's default error handler ignores it
// because the response is committed (custom error handlers must check
// c.Response().Committed too). If the error handler writes nothing, the
// key is released. A panic releases the key and is re-raised, so
// middleware.Recover answers it whether mounted before or after idemecho.
//
// Streaming (c.Response().Flush(), text/event-stream) is passed straight
// through to the client, never held back; the bytes are also captured, so a
// retry after the stream ended gets the whole stream replayed, a retry
// during it gets 409 (or waits, with idem.WithWait). A stream longer than
// the engine's MaxResponseBytes is answered on retry with 410
// "response-not-stored".
package idemecho

import (
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
// through untouched (Echo's Skipper idiom). Optional. Default is
// middleware.DefaultSkipper (skip nothing); methods the engine does not
// cover always pass through.
func WithSkipper(s middleware.Skipper) Option { return func(c *config) { c.skipper = s } }

// New returns Echo middleware enforcing idempotency keys with e.
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
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if !e.Covers(r.Method) || cfg.skipper(c) {
				return next(c)
			}
			principal := ""
			if cfg.scope != nil {
				principal = cfg.scope(c)
			}
			x, resp := e.BeginHTTP(r, cfg.route(c), principal)
			if resp != nil {
				if resp.IsReplay() {
					c.SetRequest(r.WithContext(idem.ContextWithInfo(r.Context(), idem.Info{Replayed: true})))
				}
				resp.Send(c.Response())
				return nil
			}
			if x == nil { // fail-open
				return next(c)
			}
			c.SetRequest(r.WithContext(x.WithInfo(r.Context())))
			res := c.Response()
			w := res.Writer
			res.Writer = x.NewCaptureWriter(w)
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
			if err != nil {
				c.Error(err) // write the error response now, so it is recorded
			}
			if err != nil && !res.Committed {
				x.Fail() // an error without a response
			} else {
				x.Finish(res.Status, res.Header())
			}
			return err
		}
	}
}
