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
// principal, and on the route (or group) it protects: the default route
// scope is c.Route().Path, which under app.Use is the Use prefix, so keys
// are then scoped per prefix (the same key sent to two routes under it is
// answered 422); WithRoute changes that. Handlers find the scoped key with
// idem.InfoFromContext(c.UserContext()); on a replay, middleware outside
// idemfiber sees idem.Info{Replayed: true} there.
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
	"net/http"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/utils"

	idem "github.com/idemkit/idem/core"
)

// Option configures the middleware.
type Option func(*config)

type config struct {
	scope func(*fiber.Ctx) string
	route func(*fiber.Ctx) string
	next  func(*fiber.Ctx) bool
}

// WithScope sets the function returning the authenticated principal of a
// request (user, account or API client id), e.g. from c.Locals("user_id")
// as set by the app's authentication middleware; it is part of the key's
// scope. An empty result is answered with 401 unless the engine has
// idem.WithGlobalScope. Required unless the engine uses idem.WithGlobalScope.
func WithScope(fn func(*fiber.Ctx) string) Option { return func(c *config) { c.scope = fn } }

// WithRoute sets the function returning the route template of a request,
// part of the key's scope; its result is copied. Optional. Default is
// c.Route().Path: the route idemfiber is mounted on, e.g.
// "/v1/payments/:id", or the prefix under app.Use.
func WithRoute(fn func(*fiber.Ctx) string) Option { return func(c *config) { c.route = fn } }

// WithNext sets a function that, returning true, lets a request pass through
// untouched (Fiber's Next idiom). Optional. Default is nil (skip nothing);
// methods the engine does not cover always pass through.
func WithNext(fn func(*fiber.Ctx) bool) Option { return func(c *config) { c.next = fn } }

// New returns Fiber middleware enforcing idempotency keys with e.
func New(e *idem.Engine, opts ...Option) fiber.Handler {
	cfg := config{route: func(c *fiber.Ctx) string { return c.Route().Path }}
	for _, o := range opts {
		o(&cfg)
	}
	name := []byte(e.Header())
	return func(c *fiber.Ctx) error {
		if !e.Covers(c.Method()) || cfg.next != nil && cfg.next(c) {
			return c.Next()
		}
		rq := c.Request()
		req := idem.Request{
			Method: strings.Clone(c.Method()),
			Route:  strings.Clone(cfg.route(c)),
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
		x, resp := e.Begin(c.UserContext(), &req)
		if resp != nil {
			if resp.IsReplay() {
				c.SetUserContext(idem.ContextWithInfo(c.UserContext(), idem.Info{Replayed: true}))
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
		c.SetUserContext(x.WithInfo(c.UserContext()))
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
		res.Header.VisitAll(func(k, v []byte) { header.Add(string(k), string(v)) }) //nolint:staticcheck // VisitAll as above; copies
		x.Finish(res.StatusCode(), header)
		return nil
	}
}
