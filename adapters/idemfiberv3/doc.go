// Package idemfiberv3 is the Fiber v3 (github.com/gofiber/fiber/v3) adapter
// of idem: a fiber.Handler that runs each request covered by an
// [idem.Engine] (POST and PATCH by default) at most once per idempotency key
// and replays the stored response to duplicates. It only translates between
// Fiber and the engine; every decision (key syntax, scope, status policy,
// limits) is the engine's. For Fiber v2 use idemfiber; the two modules never
// pull in each other's Fiber.
//
//	e, err := idem.New(store)
//	app.Post("/v1/payments", auth, idemfiberv3.New(e, idemfiberv3.WithScope(func(c fiber.Ctx) string {
//		return fiber.Locals[string](c, "user_id")
//	})), createPayment)
//
// Mount it after authentication, so that the scope function can read the
// principal: per route, on a group (app.Group("/v2", auth, idem)) or with
// app.Use. Under a group or Use, c.Route() (and c.FullPath()) is the
// middleware's own route, its prefix, exactly as in v2, so idemfiberv3
// finds the route the request will reach in the app's stack
// (fiber.RoutePatternMatch, honouring CaseSensitive and StrictRouting) and
// scopes the key by it; a request no route matches passes through
// untouched (Fiber's 404 stays). WithNext exempts routes such as webhooks.
// Response header lines set before idemfiberv3 runs (CORS, request ids)
// belong to each exchange and are never stored or replayed. Built without
// WithScope for an engine without idem.WithGlobalScope, New panics.
//
// # What changed from Fiber v2 (idemfiber)
//
// Context: fiber.Ctx is an interface and UserContext is gone. A Fiber v3
// handler finds the scoped key with idem.InfoFromContext(c) (Ctx is a
// context.Context whose Value reads c.Locals) or
// idem.InfoFromContext(c.Context()): idemfiberv3 sets both. On a replay,
// middleware outside idemfiberv3 sees idem.Info{Replayed: true} there.
// c.Done() is nil in v3 as c.UserContext() was never cancelled in v2: a
// client hang-up does not cancel the handler, and its answer is recorded.
//
// Buffers: as in v2, fasthttp reuses request and response buffers once the
// handler returns, and Fiber's strings alias them unless the app has
// Config.Immutable. idemfiberv3 reads fasthttp's buffers directly, whatever
// Immutable says, and copies every value it keeps (route, keys, recorded
// header lines, body); c.Method() is now a string of the app's method
// table, which needs no copy.
//
// Errors and panics: unchanged from v2. Fiber turns a returned error into a
// response only after the chain, so idemfiberv3 calls the app's error
// handler itself (c.App().ErrorHandler, as Fiber's logger middleware does)
// and returns nil: a fiber.NewError(402, ...) is stored and replayed as
// written, a plain error becomes the error handler's 500 and the key is
// released. A panic releases the key and is re-raised, so the recover
// middleware answers it whether mounted before or after idemfiberv3;
// recover mounted after idemfiberv3 returns an error, handled as above.
//
// New in v3, c.End() writes the response to the connection and closes it
// before the chain returns: idemfiberv3 records that response, and a retry
// gets it replayed (a retry that overtakes the recording gets 409 first).
// A panic after c.End() (the client has the response) records the key as
// executed but not replayable: retries get 410 "response-not-stored",
// never a second execution (idemfiberv3 sees End as the connection it
// closed). c.Drop() closes the connection without a response, and
// neither the chain's result nor the response tells idemfiberv3 so: it
// records the response as it stands (an empty 200) and replays it, so drop
// requests (abuse, blocked clients) in middleware mounted before
// idemfiberv3, never in a handler behind it.
//
// Streaming: v3's c.SendStreamWriter, like c.SendStream and v2's
// SetBodyStreamWriter, hands fasthttp a body stream it sends after every
// handler returned, out of the middleware's sight; it can't be wrapped
// without closing it. It is never held back: idemfiberv3 records it at once
// as executed but not replayable, like a response above the engine's
// MaxResponseBytes. A retry, during or after the stream, gets 410
// "response-not-stored" with the original status and Location, never a
// second execution and never an empty 200 (a stream with a status the
// engine releases, 5xx by default, is released instead).
package idemfiberv3
