// Package idemfiber is the Fiber (v2) adapter of idem: a fiber.Handler that
// runs each request covered by an [idem.Engine] (POST and PATCH by default)
// at most once per idempotency key and replays the stored response to
// duplicates. It only translates between Fiber and the engine; every
// decision (key syntax, scope, status policy, limits) is the engine's.
//
//	e, err := idem.New(store)
//	app.Post("/v1/payments", auth, idemfiber.New(e, idemfiber.WithScope(func(c *fiber.Ctx) string {
//		s, _ := c.Locals("user_id").(string)
//		return s
//	})), createPayment)
//
// Mount it after authentication, so that the scope function can read the
// principal: per route, on a group (app.Group("/v2", auth, idem)) or with
// app.Use. Under a group or Use, c.Route() is the middleware's own route,
// so idemfiber finds the route the request will reach in the app's stack
// (fiber.RoutePatternMatch, honouring CaseSensitive and StrictRouting) and
// scopes the key by it; a request no route matches passes through untouched
// (Fiber's 404 stays). WithNext exempts routes such as webhooks. Response
// header lines set before idemfiber runs (CORS, request ids) belong to each
// exchange and are never stored or replayed. Handlers find the scoped key with
// idem.InfoFromContext(c.UserContext()) and run durable steps with
// idem.Step(c.UserContext(), ...); c.Context() and the request context of
// net/http handlers mounted through Fiber's adaptor carry the execution too
// (copied into Locals). On a replay, middleware outside idemfiber sees
// idem.Info{Replayed: true} there.
//
// Fiber and fasthttp reuse request and response buffers once the handler
// returns, and Fiber's strings alias them; idemfiber copies every value it
// hands to the engine (method, route, path, query, Content-Type, keys) and
// the recorded header lines; the engine copies body bytes.
//
// What is recorded is the response as it stands after the handler chain:
// status, header lines and body. Fiber turns a returned error into a
// response only after the chain, so idemfiber calls the app's error handler
// itself (c.App().ErrorHandler, as Fiber's logger middleware does) and
// returns nil: a fiber.NewError(402, ...) is stored and replayed as written,
// a plain error becomes the error handler's 500 and the key is released. A
// panic releases the key and is re-raised, so the recover middleware
// answers it whether mounted before or after idemfiber; recover mounted
// after idemfiber returns an error, handled as above.
//
// Streaming: a body stream (c.Context().SetBodyStreamWriter, c.SendStream,
// text/event-stream) is sent by fasthttp after every handler returned, out
// of the middleware's sight, and can't be wrapped without closing it. It is
// never held back: idemfiber records it at once as executed but not
// replayable, like a response above the engine's MaxResponseBytes. A retry,
// during or after the stream, gets 410 "response-not-stored" with the
// original status and Location, never a second execution and never an empty
// 200 (a stream with a status the engine releases, 5xx by default, is
// released instead).
package idemfiber

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/utils"
	"github.com/valyala/fasthttp"

	idem "github.com/idemkit/idem/core"
)

// Option configures the middleware.
type Option func(*config)

type config struct {
	scope func(*fiber.Ctx) string
	route func(*fiber.Ctx) string // nil: the matched route
	next  func(*fiber.Ctx) bool
}

// WithScope sets the function returning the authenticated principal of a
// request (user, account or API client id), e.g. from c.Locals("user_id")
// as set by the app's authentication middleware; it is part of the key's
// scope. An empty result is answered with 401 unless the engine has
// idem.WithGlobalScope. Required unless the engine uses idem.WithGlobalScope.
func WithScope(fn func(*fiber.Ctx) string) Option { return func(c *config) { c.scope = fn } }

// WithRoute sets the function returning the route template of a request,
// part of the key's scope; its result is copied. Optional. Default is the
// path of the route the request matched, e.g. "/v1/payments/:id", also
// under a group or app.Use.
func WithRoute(fn func(*fiber.Ctx) string) Option { return func(c *config) { c.route = fn } }

// WithNext sets a function that, returning true, lets a request pass through
// untouched, e.g. a webhook in a protected group (Fiber's Next idiom).
// Optional. Default is nil (skip nothing); methods the engine does not cover
// and requests no route matches always pass through.
func WithNext(fn func(*fiber.Ctx) bool) Option { return func(c *config) { c.next = fn } }

// New returns Fiber middleware enforcing idempotency keys with e. It panics
// without WithScope unless e has idem.WithGlobalScope.
func New(e *idem.Engine, opts ...Option) fiber.Handler {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	e.MustHaveScope(cfg.scope != nil, "idemfiber.WithScope")
	name := []byte(e.Header())
	var routes atomic.Pointer[routeIndex]
	return func(c *fiber.Ctx) error {
		if !e.Covers(c.Method()) || cfg.next != nil && cfg.next(c) {
			return c.Next()
		}
		matched := matchedRoute(&routes, c)
		if matched == nil { // no route: Fiber's 404 or 405
			return c.Next()
		}
		route := matched.Path // registered, immutable
		if cfg.route != nil {
			route = strings.Clone(cfg.route(c))
		}
		rq := c.Request()
		var keys [1]string // the usual single key line, on the stack
		req := idem.Request{
			Method: stableMethod(c.Method()),
			Route:  route,
			Keys:   keys[:0],
			// Only read during Begin (see idem.Request): no copies needed.
			Path:        utils.UnsafeString(rq.URI().Path()),
			RawQuery:    utils.UnsafeString(rq.URI().QueryString()),
			ContentType: utils.UnsafeString(rq.Header.ContentType()),
			Body:        rq.Body(),
		}
		// VisitAll, not All: fasthttp v1.51 has no All, and this module supports the
		// fasthttp v1.51 Fiber v2 requires (the workspace resolves a newer one).
		rq.Header.VisitAll(func(k, v []byte) { //nolint:staticcheck // every line, whatever the name normalising
			if bytes.EqualFold(k, name) {
				req.Keys = append(req.Keys, utils.UnsafeString(v))
			}
		})
		if cfg.scope != nil {
			req.Principal = cfg.scope(c)
		}
		recoveryFields(e, &req, rq.Header.Peek)
		x, resp := e.Begin(c.UserContext(), &req)
		if resp != nil {
			if resp.IsReplay() {
				setContext(c, replayedContext(c.UserContext()))
			}
			resp.WriteLines(&c.Response().Header)
			c.Status(resp.Status)
			c.Response().SetBody(resp.Body) // copies
			return nil
		}
		if x == nil { // fail-open
			return c.Next()
		}
		setContext(c, x.WithInfo(c.UserContext()))
		outer := outerHeader(c)
		x.OuterHeader(outer)
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
		if r := x.Override(); r != nil { // idem answers instead of the handler
			override(res, outer, r)
		}
		var body []byte
		if res.IsBodyStream() {
			x.Unreplayable()
		} else {
			body = res.Body()
		}
		var lines idem.HeaderLines     // on the stack: copied into the stored form
		res.Header.VisitAll(lines.Add) //nolint:staticcheck // VisitAll as above
		x.FinishLines(res.StatusCode(), &lines, body)
		return nil
	}
}

// setContext makes ctx the request's user context and copies its idem.Info
// into the request's Locals, so that handlers reading c.Context() (the
// fasthttp.RequestCtx, whose Value reads Locals) and net/http handlers
// mounted through Fiber's adaptor (whose request context is that
// RequestCtx) see it too: idem.InfoFromContext, idem.Step.
func setContext(c *fiber.Ctx, ctx context.Context) {
	c.SetUserContext(ctx)
	c.Locals(idem.InfoKey(), ctx.Value(idem.InfoKey()))
}

// replayedBackground is the context of a replay whose user context was
// never set (Fiber's default, context.Background()): built once, shared.
var replayedBackground = idem.ContextWithInfo(context.Background(), idem.Info{Replayed: true})

// replayedContext returns ctx carrying idem.Info{Replayed: true}.
func replayedContext(ctx context.Context) context.Context {
	if ctx == context.Background() {
		return replayedBackground
	}
	return idem.ContextWithInfo(ctx, idem.Info{Replayed: true})
}

// stableMethod returns m, which may alias a request buffer, as a string
// that does not: a constant for the usual methods, else a copy.
func stableMethod(m string) string {
	switch m {
	case fiber.MethodPost:
		return fiber.MethodPost
	case fiber.MethodPatch:
		return fiber.MethodPatch
	case fiber.MethodPut:
		return fiber.MethodPut
	case fiber.MethodDelete:
		return fiber.MethodDelete
	}
	return strings.Clone(m)
}

// outerHeader copies the response header lines set before the handler ran,
// or returns nil when there are none but fasthttp's default Content-Type.
func outerHeader(c *fiber.Ctx) http.Header {
	var out http.Header
	c.Response().Header.VisitAll(func(k, v []byte) { //nolint:staticcheck // VisitAll: fasthttp v1.51 has no All (see the note in New)
		if out == nil {
			if bytes.Equal(k, contentType) && bytes.Equal(v, defaultContentType) {
				return
			}
			out = make(http.Header)
		}
		out.Add(string(k), string(v))
	})
	return out
}

var (
	contentType        = []byte(fiber.HeaderContentType)
	defaultContentType = []byte("text/plain; charset=utf-8") // fasthttp's
)

// routeIndex is what idemfiber knows of an app's routes, rebuilt when the
// app's handler count changes (routes were added).
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
// idemfiber is mounted on it, else (under a group or app.Use, whose
// c.Route() is the middleware's own) the first route registered for the
// method after the middleware whose pattern matches the path, or nil when
// none does.
func matchedRoute(cache *atomic.Pointer[routeIndex], c *fiber.Ctx) *fiber.Route {
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
	if !idx.cfg.CaseSensitive && hasUpper(path) {
		path = utils.ToLower(path)
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
					l.static = utils.ToLower(l.static)
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

// hasUpper reports whether s has an ASCII capital letter (utils.ToLower
// allocates even when there is none).
func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
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

// override replaces the handler's response with r (idem.Execution.Override),
// the header lines as they were before the handler ran (outer).
func override(res *fasthttp.Response, outer http.Header, r *idem.Response) {
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

// Runner returns an idem.Runner that runs the requests an idem.Recoverer
// rebuilt through app's whole handler chain in process (app.Test, no
// timeout), for idem.RecoverRequests.
func Runner(app *fiber.App) idem.Runner {
	return func(req *http.Request) (int, error) {
		if req.Host == "" {
			req.Host = "localhost"
		}
		resp, err := app.Test(req, -1)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
}
