package main

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/payments"
	"github.com/idemkit/idem/observability/idemui"
)

// nethttpServer serves app's routes on net/http's ServeMux: recovery and
// request ids outside everything (idem never stores or replays what they
// set: a replay carries this exchange's X-Request-Id), then authentication,
// then idem, then the route; tracing outermost, so that idem finds the
// request's span in its context.
func nethttpServer(app *payments.App) (payments.Server, error) {
	idempotent := idemhttp.New(app.Engine, idemhttp.WithScope(httpUserID))
	if app.Config.NoIdem { // the benchmarks' baseline: the same service, unprotected
		idempotent = func(h http.Handler) http.Handler { return h }
	}
	mux := http.NewServeMux()
	for _, rt := range payments.Routes(app.Service) {
		h := http.Handler(httpRoute(rt))
		if rt.Protected {
			h = httpAuthenticate(app, idempotent(h))
		}
		mux.Handle(rt.Method+" "+rt.Path, h)
	}
	mux.Handle("GET /metrics", app.Metrics)
	if token := app.Config.ConsoleToken; token != "" { // the operator's console, outside the API's authentication
		mux.Handle("/admin/idem/", http.StripPrefix("/admin/idem", idemui.Handler(app.Store, idemui.WithToken(token), idemui.WithWrites(nil))))
	}
	chain := httpRequestID(httpRecoverer(mux))
	if err := app.Recover(idem.HTTPRunner(chain)); err != nil {
		return nil, err
	}
	return &http.Server{Handler: otelhttp.NewHandler(chain, "payments"), ReadHeaderTimeout: 10 * time.Second}, nil
}

// httpRoute adapts rt to net/http.
func httpRoute(rt payments.Route) http.HandlerFunc {
	name := rt.Param()
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			writeHTTP(w, payments.ProblemResponse(payments.Invalid("reading the body: "+err.Error())))
			return
		}
		writeHTTP(w, rt.Handle(r.Context(), payments.Request{User: httpUserID(r), Param: r.PathValue(name), Body: body}))
	}
}

func writeHTTP(w http.ResponseWriter, res payments.Response) {
	w.Header().Set("Content-Type", res.ContentType)
	if res.Location != "" {
		w.Header().Set("Location", res.Location)
	}
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
}

type httpUserKey struct{}

// httpAuthenticate stands in for real authentication: it trusts X-User-ID,
// or re-establishes a recovery run's stored principal (app.User).
func httpAuthenticate(app *payments.App, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := app.User(r.Header.Get(idem.RecoveryHeader), r.Header.Get("X-User-ID"))
		if user == "" {
			writeHTTP(w, payments.ProblemResponse(payments.Unauthenticated))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), httpUserKey{}, user)))
	})
}

// httpUserID returns the principal httpAuthenticate stored.
func httpUserID(r *http.Request) string { s, _ := r.Context().Value(httpUserKey{}).(string); return s }

// httpRequestID echoes the client's X-Request-Id, or a new one, on the response.
func httpRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if id == "" {
			id = rand.Text()
		}
		w.Header().Set("X-Request-Id", id)
		next.ServeHTTP(w, r)
	})
}

// httpRecoverer turns a panic into a 500 problem; idem has released the key.
func httpRecoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				slog.Error("panic", "value", p, "path", r.URL.Path)
				writeHTTP(w, payments.ProblemResponse(payments.InternalError))
			}
		}()
		next.ServeHTTP(w, r)
	})
}
