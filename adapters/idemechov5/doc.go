// Package idemechov5 is the Echo v5 (github.com/labstack/echo/v5) adapter
// of idem: an echo.MiddlewareFunc that runs each request covered by an
// [idem.Engine] (POST and PATCH by default) at most once per idempotency key
// and replays the stored response to duplicates. It only translates between
// Echo and the engine; every decision (key syntax, scope, status policy,
// limits) is the engine's. For Echo v4 use idemecho; the two modules never
// pull in each other's Echo.
//
//	e, err := idem.New(store)
//	api := app.Group("/v1", auth) // auth sets "user_id"
//	api.Use(idemechov5.New(e, idemechov5.WithScope(func(c *echo.Context) string {
//		s, _ := echo.ContextGet[string](c, "user_id")
//		return s
//	})))
//
// Mount it after authentication, so that the scope function can read the
// principal: per route, on a group or with e.Use. Requests no route
// matched (Echo's 404 and 405, a group's catch-all) pass through untouched,
// and WithSkipper exempts routes such as webhooks. Response header lines set
// before idemechov5 runs (CORS, request ids) belong to each exchange and are
// never stored or replayed. Built without WithScope for an engine without
// idem.WithGlobalScope, New panics. Handlers find the scoped key with
// idem.InfoFromContext(c.Request().Context()); on a replay, middleware
// outside idemechov5 sees idem.Info{Replayed: true} there.
//
// What is recorded is what the client got: the first status written, the
// response header lines and every body byte written. A panic releases the
// key and is re-raised (if a status was already sent, the key is completed
// as executed but not replayable, 410 on retry).
//
// # What changed from Echo v4 (idemecho)
//
// Context: options take *echo.Context, a struct in v5 (echo.Context was an
// interface). c.Response() is now an http.ResponseWriter that middleware
// and Echo itself (c.JSON's delayed status writer) replace with
// c.SetResponse, and handlers reach the *echo.Response beneath with
// echo.UnwrapResponse, e.g. to write to it directly. A capture wrapped
// around c.Response() would miss those writes and store an empty 200, so
// idemechov5 puts its idem.CaptureWriter beneath the *echo.Response (as
// v4's adapter did with Response().Writer), where every write ends up;
// only when an outer middleware hid the *echo.Response behind a writer
// without Unwrap does it wrap c.Response() instead. Committed and Status
// of the *echo.Response keep working, and c.JSON still answers an
// encoding failure with the error handler's status, never a half-written
// 2xx.
//
// Errors: c.Error is gone and the error handler's parameters are swapped
// (func(c *echo.Context, err error)). Echo turns a handler's returned error
// into a response only after the middleware chain, so idemechov5 calls
// c.Echo().HTTPErrorHandler(c, err) itself before recording: an
// echo.NewHTTPError(402, ...) is stored and replayed as written, a plain
// error becomes the error handler's 500 and the key is released. The error
// is then handled, so idemechov5 returns nil, as v4's idemecho does: the
// app's HTTPErrorHandler (and the error reporter in it) runs once per
// error. Outer middleware reads the error with HandledError; v5's own
// RequestLogger (HandleError) returns a handled error instead and relies on
// every error handler checking echo.UnwrapResponse(c.Response()).Committed.
// If the error handler writes nothing, the key is released and the error is
// returned for the outer chain to answer. Custom error handlers must read
// the status with echo.StatusCode(err): echo.ErrNotFound and the other
// predefined errors are no longer *echo.HTTPError in v5.
//
// Routes: v5 names Echo's 404 and 405 answers and RouteNotFound routes in
// c.RouteInfo(), which idemechov5 reads to let unmatched requests through
// (v4's adapter compares handlers and route tables for the same answer).
//
// Panics: v5's middleware.Recover returns the panic as an error instead of
// calling the error handler itself as v4's did. Mounted before idemechov5,
// it sees the re-raised panic; mounted after, idemechov5 gets the error and
// answers it through the error handler as above. Either way the key is
// released and the client gets a 500.
//
// Streaming (http.NewResponseController(c.Response()).Flush(),
// text/event-stream) is passed straight through to the client, never held
// back; the bytes are also captured, so a retry after the stream ended gets
// the whole stream replayed, a retry during it gets 409 (or waits, with
// idem.WithWait). A stream longer than the engine's MaxResponseBytes is
// answered on retry with 410 "response-not-stored".
package idemechov5
