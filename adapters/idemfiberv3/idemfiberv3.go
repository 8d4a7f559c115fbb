package idemfiberv3

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/utils/v2"
	utilsstrings "github.com/gofiber/utils/v2/strings"

	idem "github.com/idemkit/idem/core"
)

// Option configures the middleware.
type Option func(*config)

type config struct {
	scope func(fiber.Ctx) string
	route func(fiber.Ctx) string // nil: the matched route
	next  func(fiber.Ctx) bool
}

// WithScope sets the function returning the authenticated principal of a
// request (user, account or API client id), e.g. from c.Locals("user_id")
// as set by the app's authentication middleware; it is part of the key's
// scope. An empty result is answered with 401 unless the engine has
// idem.WithGlobalScope. Required unless the engine uses idem.WithGlobalScope.
func WithScope(fn func(fiber.Ctx) string) Option { return func(c *config) { c.scope = fn } }

// WithRoute sets the function returning the route template of a request,
// part of the key's scope; its result is copied. Optional. Default is the
// path of the route the request matched, e.g. "/v1/payments/:id", also
// under a group or app.Use.
func WithRoute(fn func(fiber.Ctx) string) Option { return func(c *config) { c.route = fn } }

// WithNext sets a function that, returning true, lets a request pass through
// untouched, e.g. a webhook in a protected group (Fiber's Next idiom, as in
// its middleware configs). Optional. Default is nil (skip nothing); methods
// the engine does not cover and requests no route matches always pass
// through.
func WithNext(fn func(fiber.Ctx) bool) Option { return func(c *config) { c.next = fn } }

// New returns Fiber v3 middleware enforcing idempotency keys with e. It
// panics without WithScope unless e has idem.WithGlobalScope.
func New(e *idem.Engine, opts ...Option) fiber.Handler {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	e.MustHaveScope(cfg.scope != nil, "idemfiberv3.WithScope")
	name := []byte(e.Header())
	var routes atomic.Pointer[routeIndex]
	return func(c fiber.Ctx) error {
		// c.Method() is a string of the app's method table, never a request buffer.
		if !e.Covers(c.Method()) || cfg.next != nil && cfg.next(c) {
			return c.Next()
		}
		matched := matchedRoute(&routes, c)
		if matched == nil { // no route: Fiber's 404 or 405
			return c.Next()
		}
		route := matched.Path // the app's route table: not reused
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
		recoveryFields(e, &req, rq.Header.Peek)
		x, resp := e.Begin(c.Context(), &req)
		if resp != nil {
			if resp.IsReplay() {
				setContext(c, idem.ContextWithInfo(c.Context(), idem.Info{Replayed: true}))
			}
			resp.WriteLines(&c.Response().Header)
			c.Status(resp.Status)
			c.Response().SetBody(resp.Body) // copies
			return nil
		}
		if x == nil { // fail-open
			return c.Next()
		}
		setContext(c, x.WithInfo(c.Context()))
		outer := outerHeader(c)
		x.OuterHeader(outer)
		defer func() {
			if p := recover(); p != nil {
				if ended(c) { // the answer went out: executed, not replayable
					x.Abort(c.Response().StatusCode(), nil)
				} else {
					x.Fail()
				}
				panic(p)
			}
		}()
		if err := c.Next(); err != nil {
			if c.App().ErrorHandler(c, err) != nil { // as Fiber does after the chain
				_ = c.SendStatus(fiber.StatusInternalServerError)
			}
		}
		res := c.Response()
		if r := x.Override(); r != nil { // idem answers instead of the handler, header lines as before it ran
			res.Header.Reset()
			for k, vs := range outer {
				for _, v := range vs {
					res.Header.Add(k, v)
				}
			}
			r.WriteLines(&res.Header)
			res.SetStatusCode(r.Status)
			res.SetBody(r.Body) // copies, and ends a body stream
		}
		var body []byte
		if res.IsBodyStream() {
			x.Unreplayable()
		} else {
			body = res.Body()
		}
		var lines idem.HeaderLines // on the stack: copied into the stored form
		for k, v := range res.Header.All() {
			lines.Add(k, v)
		}
		x.FinishLines(res.StatusCode(), &lines, body)
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
			if bytes.Equal(k, contentType) && bytes.Equal(v, defaultContentType) {
				continue
			}
			out = make(http.Header)
		}
		out.Add(string(k), string(v))
	}
	return out
}

var (
	contentType        = []byte(fiber.HeaderContentType)
	defaultContentType = []byte("text/plain; charset=utf-8") // fasthttp's
)

// routeIndex is what idemfiberv3 knows of an app's routes, rebuilt when the
// app's handler count changes (routes were added or removed).
type routeIndex struct {
	app   *fiber.App
	count uint32
	pos   map[*fiber.Route]int   // position of every route in its method's stack
	leaf  map[*fiber.Route]bool  // routes registered for a method (not Use or Group middleware)
	leafs map[string][]leafRoute // per method, in stack order
	cfg   fiber.Config
}

type leafRoute struct {
	r      *fiber.Route
	pos    int
	static string // the normalised path of a route without parameters, else ""
}

// matchedRoute returns the route c's request reaches: c.Route() when
// idemfiberv3 is mounted on it, else (under a group or app.Use, whose
// c.Route() is the middleware's own, as in v2) the first route registered
// for the method after the middleware whose pattern matches the path, or
// nil when none does.
func matchedRoute(cache *atomic.Pointer[routeIndex], c fiber.Ctx) *fiber.Route {
	app, self := c.App(), c.Route()
	idx := cache.Load()
	if idx == nil || idx.app != app || idx.count != app.HandlersCount() {
		idx = newRouteIndex(app)
		cache.Store(idx)
	}
	if idx.leaf[self] {
		return self
	}
	at, ok := idx.pos[self]
	if !ok { // not in the stack we know (a mounted sub-app?): stay protected, scoped as before
		return self
	}
	path := c.Path()
	if !idx.cfg.CaseSensitive {
		path = utilsstrings.ToLower(path)
	}
	if !idx.cfg.StrictRouting && len(path) > 1 {
		path = utils.TrimRight(path, '/')
	}
	for _, l := range idx.leafs[c.Method()] {
		if l.pos <= at {
			continue
		}
		if l.static != "" && l.static == path || l.static == "" && fiber.RoutePatternMatch(path, l.r.Path, idx.cfg) {
			return l.r
		}
	}
	return nil
}

func newRouteIndex(app *fiber.App) *routeIndex {
	type key struct {
		method, path string
		h            *fiber.Handler
	}
	first := func(r *fiber.Route) *fiber.Handler {
		if len(r.Handlers) == 0 {
			return nil
		}
		return &r.Handlers[0]
	}
	leaf := make(map[key]bool)
	for _, r := range app.GetRoutes(true) { // copies, sharing the handler arrays
		leaf[key{r.Method, r.Path, first(&r)}] = true
	}
	idx := &routeIndex{app: app, count: app.HandlersCount(), cfg: app.Config(),
		pos: make(map[*fiber.Route]int), leaf: make(map[*fiber.Route]bool), leafs: make(map[string][]leafRoute)}
	for _, stack := range app.Stack() {
		for i, r := range stack {
			idx.pos[r] = i
			if !leaf[key{r.Method, r.Path, first(r)}] {
				continue
			}
			idx.leaf[r] = true
			l := leafRoute{r: r, pos: i}
			if !strings.ContainsAny(r.Path, ":*+\\") {
				l.static = r.Path
				if !idx.cfg.CaseSensitive {
					l.static = utilsstrings.ToLower(l.static)
				}
				if !idx.cfg.StrictRouting && len(l.static) > 1 {
					l.static = utils.TrimRight(l.static, '/')
				}
			}
			idx.leafs[r.Method] = append(idx.leafs[r.Method], l)
		}
	}
	return idx
}

// ended reports whether the handler called c.End(), which writes the
// response to the connection and closes it: setting a deadline fails only
// on a closed connection (and clearing the write deadline is harmless on an
// open one, which fasthttp sets again before it writes).
func ended(c fiber.Ctx) bool {
	conn := c.RequestCtx().Conn()
	return conn != nil && conn.SetWriteDeadline(time.Time{}) != nil
}

// recoveryFields sets req's Recovery from the request's idem.RecoveryHeader
// and, for a recoverable route, its Header with the lines the route keeps;
// peek returns a request header line's value.
func recoveryFields(e *idem.Engine, req *idem.Request, peek func(name string) []byte) {
	if v := peek(idem.RecoveryHeader); len(v) > 0 {
		req.Recovery = string(v)
	}
	names := e.RecoveryHeaders(req.Method, req.Route)
	if len(names) == 0 {
		return
	}
	req.Header = make(http.Header, len(names))
	for _, n := range names {
		if v := peek(n); len(v) > 0 {
			req.Header[n] = []string{string(v)}
		}
	}
}

// Runner returns an idem.Runner that runs the requests an idem.Recoverer
// rebuilt through app's whole handler chain in process (app.Test, no
// timeout), for idem.RecoverRequests.
func Runner(app *fiber.App) idem.Runner {
	return func(req *http.Request) (int, error) {
		if req.Host == "" {
			req.Host = "localhost"
		}
		resp, err := app.Test(req, fiber.TestConfig{Timeout: 0, FailOnTimeout: false})
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
}
