package idemfiberv3

import (
	"bytes"
	"context"
	"net/http"
	"strings"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/utils/v2"

	idem "github.com/idemkit/idem/core"
)

// Option configures the middleware.
type Option func(*config)

type config struct {
	scope func(fiber.Ctx) string
	route func(fiber.Ctx) string
	next  func(fiber.Ctx) bool
}

// WithScope sets the function returning the authenticated principal of a
// request (user, account or API client id), e.g. from c.Locals("user_id")
// as set by the app's authentication middleware; it is part of the key's
// scope. An empty result is answered with 401 unless the engine has
// idem.WithGlobalScope. Required unless the engine uses idem.WithGlobalScope.
func WithScope(fn func(fiber.Ctx) string) Option { return func(c *config) { c.scope = fn } }

// WithRoute sets the function returning the route template of a request,
// part of the key's scope; its result is copied. Optional. Default is
// c.Route().Path (c.FullPath()): the route idemfiberv3 is mounted on, e.g.
// "/v1/payments/:id", or the prefix under app.Use and app.Group.
func WithRoute(fn func(fiber.Ctx) string) Option { return func(c *config) { c.route = fn } }

// WithNext sets a function that, returning true, lets a request pass through
// untouched (Fiber's Next idiom, as in its middleware configs). Optional.
// Default is nil (skip nothing); methods the engine does not cover always
// pass through.
func WithNext(fn func(fiber.Ctx) bool) Option { return func(c *config) { c.next = fn } }

// New returns Fiber v3 middleware enforcing idempotency keys with e.
func New(e *idem.Engine, opts ...Option) fiber.Handler {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	name := []byte(e.Header())
	return func(c fiber.Ctx) error {
		// c.Method() is a string of the app's method table, never a request buffer.
		if !e.Covers(c.Method()) || cfg.next != nil && cfg.next(c) {
			return c.Next()
		}
		route := c.Route().Path // the app's route table: not reused
		if cfg.route != nil {
			route = strings.Clone(cfg.route(c))
		}
		rq := c.Request()
		req := idem.Request{
			Method: c.Method(),
			Route:  route,
			// Only read during Begin (see idem.Request): no copies needed.
			Path:        utils.UnsafeString(rq.URI().Path()),
			RawQuery:    utils.UnsafeString(rq.URI().QueryString()),
			ContentType: utils.UnsafeString(rq.Header.ContentType()),
			Body:        rq.Body(),
		}
		for k, v := range rq.Header.All() { // every line, whatever the name normalising
			if bytes.EqualFold(k, name) {
				req.Keys = append(req.Keys, utils.UnsafeString(v))
			}
		}
		if cfg.scope != nil {
			req.Principal = cfg.scope(c)
		}
		x, resp := e.Begin(c.Context(), &req)
		if resp != nil {
			if resp.IsReplay() {
				setContext(c, idem.ContextWithInfo(c.Context(), idem.Info{Replayed: true}))
			}
			h := &c.Response().Header
			for k, vs := range resp.Header {
				h.Del(k)
				for _, v := range vs {
					h.Add(k, v)
				}
			}
			c.Status(resp.Status)
			c.Response().SetBody(resp.Body) // copies
			return nil
		}
		if x == nil { // fail-open
			return c.Next()
		}
		setContext(c, x.WithInfo(c.Context()))
		x.OuterHeader(outerHeader(c)) // set outside idem for this exchange: never stored
		defer func() {
			if p := recover(); p != nil {
				x.Fail()
				panic(p)
			}
		}()
		if err := c.Next(); err != nil {
			if c.App().ErrorHandler(c, err) != nil { // as Fiber does after the chain
				_ = c.SendStatus(fiber.StatusInternalServerError)
			}
		}
		res := c.Response()
		if res.IsBodyStream() {
			x.Unreplayable()
		} else {
			x.Write(res.Body()) // copies
		}
		header := make(http.Header)
		for k, v := range res.Header.All() {
			header.Add(string(k), string(v)) // copies
		}
		x.Finish(res.StatusCode(), header)
		return nil
	}
}

// setContext makes ctx the request's context for both ways Fiber v3
// handlers read one: c.Context(), and c itself, whose Value reads Locals.
func setContext(c fiber.Ctx, ctx context.Context) {
	c.SetContext(ctx)
	c.Locals(idem.InfoKey(), ctx.Value(idem.InfoKey()))
}

// outerHeader copies the response header lines set before the handler ran,
// or returns nil when there are none but fasthttp's default Content-Type.
func outerHeader(c fiber.Ctx) http.Header {
	var out http.Header
	for k, v := range c.Response().Header.All() {
		if out == nil {
			if string(k) == fiber.HeaderContentType && string(v) == "text/plain; charset=utf-8" {
				continue
			}
			out = make(http.Header)
		}
		out.Add(string(k), string(v))
	}
	return out
}
