// Command nethttp is the payments API on net/http (Go 1.22+ ServeMux
// patterns) with idem on its mutating routes. run below wires everything,
// top to bottom: the store, the engine, the authentication that sets the
// principal, the idem middleware, the routes. Run it with
//
//	go run ./examples/nethttp -store memory
//
// and see README.md for the HTTP contract every example serves.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/app"
	"github.com/idemkit/idem/examples/internal/payments"
	"github.com/idemkit/idem/observability/idemotel"
)

func main() { app.Exit(run(app.ParseFlags())) }

func run(flags app.Flags) error {
	// The store: memory (one process), Redis, MongoDB or PostgreSQL (several instances).
	store, closeStore, err := app.OpenStore(flags)
	if err != nil {
		return err
	}
	defer closeStore()

	// Telemetry: OpenTelemetry metrics served on GET /metrics (Prometheus
	// text), spans to -trace-file. idemotel turns the engine's events into
	// metrics and span attributes.
	metrics, stopTelemetry, err := app.Telemetry(flags)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	telemetry, err := idemotel.NewEventHook()
	if err != nil {
		return err
	}

	// The engine: the rules every protected route shares.
	engine, err := idem.New(store,
		idem.WithRetention(flags.TTL),
		idem.WithLease(flags.Lease),
		idem.WithStoreTimeout(flags.StoreTimeout),
		idem.WithEventHook(telemetry),
	)
	if err != nil {
		return err
	}

	// The middleware: keys are scoped by the principal authenticate sets.
	idempotent := idemhttp.New(engine, idemhttp.WithScope(userID))
	if flags.NoIdem { // the benchmarks' baseline: the same service, unprotected
		idempotent = func(h http.Handler) http.Handler { return h }
	}

	// The routes: recovery and request ids outside everything (idem never
	// stores or replays what they set: a replay carries this exchange's
	// X-Request-Id), then authentication, then idem, then the handler.
	// The payments ledger: rows in PostgreSQL with -store postgres (through
	// the execution's transaction) or -payments-postgres, else none.
	ledger, closeLedger, err := app.OpenLedger(flags)
	if err != nil {
		return err
	}
	defer closeLedger()
	api := handlers{svc: payments.New(flags.ChargeLatency, ledger)}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", authenticate(idempotent(http.HandlerFunc(api.createPayment))))
	mux.Handle("POST /v1/refunds", authenticate(idempotent(http.HandlerFunc(api.createRefund))))
	mux.Handle("POST /v1/exports", authenticate(idempotent(http.HandlerFunc(api.createExport))))
	mux.HandleFunc("GET /v1/payments/{id}", api.getPayment)
	mux.HandleFunc("GET /v1/stats", api.stats)
	mux.Handle("GET /metrics", metrics)

	// Tracing outermost, so that idem finds the request's span in its context.
	return app.Serve(flags.Addr, app.HTTPServer(otelhttp.NewHandler(requestID(recoverer(mux)), "payments")), engine, api.svc)
}

type userKey struct{}

// authenticate stands in for real authentication: it trusts X-User-ID.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := r.Header.Get("X-User-ID")
		if user == "" {
			writeError(w, payments.Unauthenticated)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

// userID returns the principal authenticate stored.
func userID(r *http.Request) string { s, _ := r.Context().Value(userKey{}).(string); return s }

// requestID echoes the client's X-Request-Id, or a new one, on the response.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if id == "" {
			id = rand.Text()
		}
		w.Header().Set("X-Request-Id", id)
		next.ServeHTTP(w, r)
	})
}

// recoverer turns a panic into a 500 problem; idem has released the key.
func recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				slog.Error("panic", "value", p, "path", r.URL.Path)
				writeError(w, &payments.Error{Status: 500, Title: "Internal error", Detail: "the server failed; retry with the same Idempotency-Key"})
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// handlers are the payment endpoints; they know nothing about idem.
type handlers struct{ svc *payments.Service }

func (h handlers) createPayment(w http.ResponseWriter, r *http.Request) {
	var req payments.ChargeRequest
	if !decode(w, r, &req) {
		return
	}
	p, err := h.svc.Charge(r.Context(), userID(r), req)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Location", "/v1/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

func (h handlers) createRefund(w http.ResponseWriter, r *http.Request) {
	var req payments.RefundRequest
	if !decode(w, r, &req) {
		return
	}
	rf, err := h.svc.Refund(r.Context(), userID(r), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, rf)
}

func (h handlers) createExport(w http.ResponseWriter, r *http.Request) {
	var req payments.ExportRequest
	if !decode(w, r, &req) {
		return
	}
	b, err := h.svc.Export(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(b)
}

func (h handlers) getPayment(w http.ResponseWriter, r *http.Request) {
	if p, ok := h.svc.Payment(r.PathValue("id")); ok {
		writeJSON(w, http.StatusOK, p)
		return
	}
	writeError(w, &payments.Error{Status: 404, Title: "Payment not found", Detail: "no payment " + r.PathValue("id")})
}

func (h handlers) stats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, h.svc.Stats())
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(v); err != nil {
		writeError(w, payments.Invalid(fmt.Sprintf("body must be JSON: %v", err)))
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes err as an RFC 9457 problem.
func writeError(w http.ResponseWriter, err error) {
	var pe *payments.Error
	if !errors.As(err, &pe) {
		pe = &payments.Error{Status: 500, Title: "Internal error", Detail: err.Error()}
	}
	w.Header().Set("Content-Type", payments.ProblemContentType)
	w.WriteHeader(pe.Status)
	_, _ = w.Write(pe.Problem())
}
