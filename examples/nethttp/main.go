// Command nethttp is the payments API on net/http (Go 1.22+ ServeMux
// patterns) with idem on its mutating routes. run below wires everything,
// top to bottom: the store, the engine, the authentication that sets the
// principal, the idem middleware, the routes. Run it with
//
//	go run ./examples/nethttp -store memory
//
// and see README.md for the HTTP contract every example serves.
//
// This folder is a complete program, copyable on its own (README.md,
// "Running an example as your own module"): main.go is this framework's
// wiring; store.go (the command line, the store and its purger, the
// payments ledger), telemetry.go (/metrics, traces) and payments.go (the
// fake domain) are the same in every example folder, duplicated so that
// each folder stands alone.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemotel"
)

func main() {
	if err := run(parseFlags()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(flags config) error {
	// The store -store names (store.go): memory for one process; Redis,
	// MongoDB, PostgreSQL or MySQL shared by several instances. The SQL
	// stores run a purger that deletes expired records; closeStore stops it.
	store, closeStore, err := openStore(flags)
	if err != nil {
		return err
	}
	defer closeStore()

	// Telemetry (telemetry.go): OpenTelemetry metrics served on GET /metrics
	// (Prometheus text), spans to -trace-file. idemotel turns the engine's
	// events into metrics and span attributes.
	metrics, stopTelemetry, err := telemetry(flags)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	hook, err := idemotel.NewEventHook()
	if err != nil {
		return err
	}

	// The engine: the rules every protected route shares.
	engine, err := idem.New(store,
		idem.WithRetention(flags.TTL),
		idem.WithLease(flags.Lease),
		idem.WithStoreTimeout(flags.StoreTimeout),
		idem.WithUncertainAfterCrash(flags.UncertainAfterCrash),
		idem.WithEventHook(hook),
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
	// The payments ledger (store.go): with -store postgres or mysql each
	// payment is a row written through the execution's transaction
	// (pgstore.Tx, mysqlstore.Tx), committed with the stored response.
	ledger, closeLedger, err := openLedger(flags)
	if err != nil {
		return err
	}
	defer closeLedger()
	api := handlers{svc: newService(flags.ChargeLatency, ledger)}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", authenticate(idempotent(http.HandlerFunc(api.createPayment))))
	mux.Handle("POST /v1/refunds", authenticate(idempotent(http.HandlerFunc(api.createRefund))))
	mux.Handle("POST /v1/exports", authenticate(idempotent(http.HandlerFunc(api.createExport))))
	mux.HandleFunc("GET /v1/payments/{id}", api.getPayment)
	mux.HandleFunc("GET /v1/stats", api.stats)
	mux.Handle("GET /metrics", metrics)

	// Tracing outermost, so that idem finds the request's span in its context.
	return serve(flags.Addr, &http.Server{Handler: otelhttp.NewHandler(requestID(recoverer(mux)), "payments"), ReadHeaderTimeout: 10 * time.Second}, engine, api.svc)
}

type userKey struct{}

// authenticate stands in for real authentication: it trusts X-User-ID.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := r.Header.Get("X-User-ID")
		if user == "" {
			writeError(w, Unauthenticated)
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
				writeError(w, &Error{Status: 500, Title: "Internal error", Detail: "the server failed; retry with the same Idempotency-Key"})
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// handlers are the payment endpoints; they know nothing about idem.
type handlers struct{ svc *Service }

func (h handlers) createPayment(w http.ResponseWriter, r *http.Request) {
	var req ChargeRequest
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
	var req RefundRequest
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
	var req ExportRequest
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
	writeError(w, &Error{Status: 404, Title: "Payment not found", Detail: "no payment " + r.PathValue("id")})
}

func (h handlers) stats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, h.svc.Stats())
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(v); err != nil {
		writeError(w, Invalid(fmt.Sprintf("body must be JSON: %v", err)))
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
	var pe *Error
	if !errors.As(err, &pe) {
		pe = &Error{Status: 500, Title: "Internal error", Detail: err.Error()}
	}
	w.Header().Set("Content-Type", ProblemContentType)
	w.WriteHeader(pe.Status)
	_, _ = w.Write(pe.Problem())
}

// serve listens on addr, prints "listening on http://ADDR" once it accepts
// connections, and serves srv until SIGINT or SIGTERM. Then it shuts down
// gracefully: srv stops accepting and lets in-flight requests finish, then
// engine.Close waits for the completions the engine is still retrying after
// a store error, all within 10s (more than the 5s net/http waits for a
// connection that has not sent a request yet). Last it prints
// "executions N", the provider executions (tests/chaos reads both lines).
func serve(addr string, srv *http.Server, engine *idem.Engine, svc *Service) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening on http://%s\n", ln.Addr()) // after the signal handler: a SIGTERM from now on shuts down cleanly
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	if err := engine.Close(shutdown); err != nil {
		slog.Warn("idem: completions still retrying were abandoned", "err", err)
	}
	fmt.Printf("executions %d\n", svc.Stats().Executions)
	return nil
}
