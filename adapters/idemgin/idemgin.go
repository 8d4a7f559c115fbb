// Package idemgin is the Gin adapter of idem: a gin.HandlerFunc that runs
// each request covered by an [idem.Engine] (POST and PATCH by default) at
// most once per idempotency key and replays the stored response to
// duplicates. It only translates between Gin and the engine; every decision
// (key syntax, scope, status policy, limits) is the engine's.
//
//	e, err := idem.New(store)
//	r.Use(auth) // sets "user_id"
//	r.POST("/v1/payments", idemgin.New(e, idemgin.WithScope(func(c *gin.Context) string {
//		return c.GetString("user_id")
//	})), createPayment)
//
// Mount it after authentication, so that the scope function can read the
// principal, on routes, a group or the whole engine; WithSkipper exempts
// routes such as webhooks. Response header lines set before idemgin runs
// (CORS, request ids) belong to each exchange and are never stored or
// replayed. Handlers find the scoped key with
// idem.InfoFromContext(c.Request.Context()); on a replay, middleware outside
// idemgin sees idem.Info{Replayed: true} there.
//
// What is recorded is what the client got: c.Writer.Status() after the
// handler chain, the response header lines and every body byte written. A
// handler that aborts with c.AbortWithStatus(500) is released by the engine's
// status policy, one that answers c.AbortWithStatusJSON(402, ...) is stored.
// A handler that reports an error with c.Error and writes nothing has failed
// without a response: the key is released (idem.Execution.Fail), whatever an
// outer error middleware then writes. A panic releases the key and is
// re-raised, so gin.Recovery answers it whether it is mounted before or after
// idemgin.
//
// Streaming (c.Stream, c.SSEvent, Flush) is passed straight through to the
// client, never held back; the bytes are also captured, so a retry after the
// stream ended gets the whole stream replayed, a retry during it gets 409
// (or waits, with idem.WithWait). A stream longer than the engine's
// MaxResponseBytes is answered on retry with 410 "response-not-stored".
package idemgin

import (
	"net/http"

	"github.com/gin-gonic/gin"

	idem "github.com/idemkit/idem/core"
)

// Option configures the middleware.
type Option func(*config)

type config struct {
	scope func(*gin.Context) string
	route func(*gin.Context) string
	skip  func(*gin.Context) bool
}

// WithScope sets the function returning the authenticated principal of a
// request (user, account or API client id), e.g. c.GetString("user_id") as
// set by the app's authentication middleware; it is part of the key's scope.
// An empty result is answered with 401 unless the engine has
// idem.WithGlobalScope. Required unless the engine uses idem.WithGlobalScope.
func WithScope(fn func(*gin.Context) string) Option { return func(c *config) { c.scope = fn } }

// WithRoute sets the function returning the route template of a request,
// part of the key's scope. Optional. Default is c.FullPath(), the matched
// route (e.g. "/v1/payments/:id").
func WithRoute(fn func(*gin.Context) string) Option { return func(c *config) { c.route = fn } }

// WithSkipper sets a predicate that, returning true, lets a request pass
// through untouched, e.g. a webhook in a protected group (Gin's Skipper, as
// in gin.LoggerConfig.Skip; Echo's Skipper, Fiber's Next). Optional. Default
// is nil (skip nothing); methods the engine does not cover and requests no
// route matched always pass through.
func WithSkipper(fn gin.Skipper) Option { return func(c *config) { c.skip = fn } }

// New returns Gin middleware enforcing idempotency keys with e. Mount it on
// a route, a group or the engine (r.Use): requests whose method e does not
// cover, that no route matched (c.FullPath() is empty: Gin's 404 and 405
// keep their status) or that the skipper skips pass through untouched. New
// panics without WithScope unless e has idem.WithGlobalScope.
func New(e *idem.Engine, opts ...Option) gin.HandlerFunc {
	cfg := config{route: (*gin.Context).FullPath}
	for _, o := range opts {
		o(&cfg)
	}
	e.MustHaveScope(cfg.scope != nil, "idemgin.WithScope")
	return func(c *gin.Context) {
		r := c.Request
		if !e.Covers(r.Method) || c.FullPath() == "" || cfg.skip != nil && cfg.skip(c) {
			c.Next()
			return
		}
		principal := ""
		if cfg.scope != nil {
			principal = cfg.scope(c)
		}
		x, resp := e.BeginHTTP(r, cfg.route(c), principal)
		if resp != nil {
			if resp.IsReplay() {
				c.Request = idem.RequestWithInfo(r, idem.Info{Replayed: true})
			}
			resp.Send(c.Writer)
			c.Abort()
			return
		}
		if x == nil { // fail-open
			c.Next()
			return
		}
		w := c.Writer
		run := &running{cw: captureWriter{ResponseWriter: w, x: x}}
		run.req = *r.WithContext(x.WithInfo(r.Context())) // WithContext is inlined: its copy stays on the stack
		c.Request = &run.req
		x.OuterHeader(w.Header())
		if len(w.Header()) > 0 {
			run.cw.outer = w.Header().Clone()
		}
		c.Writer = &run.cw
		defer func() {
			c.Writer = w
			if p := recover(); p != nil {
				sent := 0
				if w.Written() {
					sent = w.Status()
				}
				x.Abort(sent, w.Header())
				panic(p)
			}
		}()
		c.Next()
		if !w.Written() {
			run.cw.overridden() // idem answers instead of a handler that wrote nothing
		}
		if len(c.Errors) > 0 && !w.Written() {
			x.Fail() // c.Error without a response
			return
		}
		x.Finish(w.Status(), w.Header())
	}
}

// running is what the handler chain of an execution gets, in one
// allocation: the capturing writer and the request carrying idem.Info.
type running struct {
	cw  captureWriter
	req http.Request
}

// captureWriter passes every write straight through to the client and
// copies the body bytes to the execution; status and header are read from
// the wrapped writer after the handler chain. Once the execution answers
// instead of the handler (idem.Execution.Override), the handler's first
// write sends that answer and its writes are dropped.
type captureWriter struct {
	gin.ResponseWriter
	x        *idem.Execution
	outer    http.Header // the header lines before the handler ran
	override bool        // idem's answer was sent in place of the handler's
}

// overridden reports whether the handler's writes are dropped, sending
// idem's answer first when it has one and nothing was written.
func (w *captureWriter) overridden() bool {
	if w.override {
		return true
	}
	if w.Written() {
		return false
	}
	r := w.x.Override()
	if r == nil {
		return false
	}
	w.override = true
	idem.ResetHeader(w.Header(), w.outer)
	r.Send(w.ResponseWriter)
	return true
}

// WriteHeaderNow sends the header (c.AbortWithStatus), or idem's answer
// in its place.
func (w *captureWriter) WriteHeaderNow() {
	if !w.overridden() {
		w.ResponseWriter.WriteHeaderNow()
	}
}

// Flush sends what was written (c.Stream), unless idem answers instead.
func (w *captureWriter) Flush() {
	if !w.overridden() {
		w.ResponseWriter.Flush()
	}
}

func (w *captureWriter) Write(p []byte) (int, error) {
	if w.overridden() {
		return len(p), nil
	}
	if !w.Written() {
		w.x.SnapshotHeader(w.Header())
	}
	n, err := w.ResponseWriter.Write(p)
	w.x.Write(p[:n])
	return n, err
}

func (w *captureWriter) WriteString(s string) (int, error) {
	if w.overridden() {
		return len(s), nil
	}
	if !w.Written() {
		w.x.SnapshotHeader(w.Header())
	}
	n, err := w.ResponseWriter.WriteString(s)
	w.x.Write([]byte(s[:n]))
	return n, err
}

// Unwrap lets http.ResponseController reach the wrapped writer.
func (w *captureWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
