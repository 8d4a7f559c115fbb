// Package idemhttp is the net/http adapter of idem: middleware of the shape
// func(http.Handler) http.Handler for net/http, chi and any router built on
// http.Handler. It translates requests and responses; every decision is the
// [idem.Engine]'s.
//
//	e, err := idem.New(store)
//	mux.Handle("POST /v1/payments", idemhttp.New(e, idemhttp.WithScope(userID))(payments))
package idemhttp

import (
	"bytes"
	"io"
	"net/http"
	"strings"

	idem "github.com/idemkit/idem/core"
)

// Option configures the middleware.
type Option func(*config)

type config struct {
	scope func(*http.Request) string
	route func(*http.Request) string
}

// WithScope sets the function returning the authenticated principal of a
// request (user, account or API client id), read from what the app's own
// authentication middleware stored in the request context; it is part of the
// key's scope. An empty result is answered with 401 unless the engine has
// idem.WithGlobalScope. Required unless the engine uses idem.WithGlobalScope.
func WithScope(fn func(*http.Request) string) Option { return func(c *config) { c.scope = fn } }

// WithRoute sets the function returning the route template of a request,
// part of the key's scope. Optional. Default is r.Pattern without its method
// ("POST /v1/payments" → "/v1/payments", as Gin, Echo and Fiber name routes),
// set by http.ServeMux for the handler it routes to (Go 1.23+); the engine
// falls back to r.URL.Path when it is empty.
func WithRoute(fn func(*http.Request) string) Option { return func(c *config) { c.route = fn } }

// New returns middleware that runs each request covered by e (POST and
// PATCH by default) at most once per idempotency key and replays the stored
// response to duplicates. A panic in next releases the key and is re-raised
// for the server's or the app's recovery.
func New(e *idem.Engine, opts ...Option) func(http.Handler) http.Handler {
	c := config{route: route}
	for _, o := range opts {
		o(&c)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !e.Covers(r.Method) {
				next.ServeHTTP(w, r)
				return
			}
			req := idem.Request{
				Method:      r.Method,
				Route:       c.route(r),
				Path:        r.URL.Path,
				RawQuery:    r.URL.RawQuery,
				ContentType: r.Header.Get("Content-Type"),
				Keys:        r.Header.Values(e.Header()),
				BodyReader:  r.Body,
			}
			if c.scope != nil {
				req.Principal = c.scope(r)
			}
			x, resp := e.Begin(r.Context(), &req)
			if resp != nil {
				resp.Send(w)
				return
			}
			if req.BodyReader == nil { // Begin consumed the body: hand the handler the same bytes
				r.Body = io.NopCloser(bytes.NewReader(req.Body))
			}
			if x == nil { // fail-open
				next.ServeHTTP(w, r)
				return
			}
			r = r.WithContext(idem.ContextWithInfo(r.Context(), idem.Info{Key: x.Key()}))
			cw := &captureWriter{ResponseWriter: w, x: x}
			defer func() {
				if p := recover(); p != nil {
					x.Fail()
					panic(p)
				}
			}()
			next.ServeHTTP(cw, r)
			x.Finish(cw.status, w.Header())
		})
	}
}

func route(r *http.Request) string {
	if _, path, ok := strings.Cut(r.Pattern, " "); ok {
		return path
	}
	return r.Pattern
}

// captureWriter passes everything through to the client at once (streams and
// flushes are not held back) and copies the status and body to the execution.
type captureWriter struct {
	http.ResponseWriter
	x      *idem.Execution
	status int
}

func (w *captureWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *captureWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.x.Write(p[:n])
	return n, err
}

// Flush sends buffered data to the client, for streaming handlers that
// assert http.Flusher.
func (w *captureWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *captureWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
