// Command nethttp is the payments API on net/http (Go 1.22+ ServeMux
// patterns) with idem on its mutating routes. Run it with
//
//	go run ./examples/nethttp -store memory
//
// and see README.md for the HTTP contract every example serves.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/idemkit/idem/adapters/idemhttp"
	"github.com/idemkit/idem/examples/internal/app"
	"github.com/idemkit/idem/examples/internal/payments"
)

func main() {
	app.Run(app.ParseFlags(), func(d app.Deps) app.Server { return app.HTTPServer(routes(d)) })
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

func userID(r *http.Request) string { s, _ := r.Context().Value(userKey{}).(string); return s }

// recoverer turns a panic into a 500 problem; the process lives on.
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

func routes(d app.Deps) http.Handler {
	svc := d.Payments
	protect := func(h http.HandlerFunc) http.Handler { return authenticate(h) }
	if d.Engine != nil {
		idempotent := idemhttp.New(d.Engine, idemhttp.WithScope(userID))
		protect = func(h http.HandlerFunc) http.Handler { return authenticate(idempotent(h)) } // auth first, then idem
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", protect(func(w http.ResponseWriter, r *http.Request) {
		var req payments.ChargeRequest
		if !decode(w, r, &req) {
			return
		}
		p, err := svc.Charge(r.Context(), userID(r), req)
		if err != nil {
			writeError(w, err)
			return
		}
		w.Header().Set("Location", "/v1/payments/"+p.ID)
		writeJSON(w, http.StatusCreated, p)
	}))
	mux.Handle("POST /v1/refunds", protect(func(w http.ResponseWriter, r *http.Request) {
		var req payments.RefundRequest
		if !decode(w, r, &req) {
			return
		}
		rf, err := svc.Refund(r.Context(), userID(r), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusCreated, rf)
	}))
	mux.Handle("POST /v1/exports", protect(func(w http.ResponseWriter, r *http.Request) {
		var req payments.ExportRequest
		if !decode(w, r, &req) {
			return
		}
		b, err := svc.Export(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(b)
	}))
	mux.HandleFunc("GET /v1/payments/{id}", func(w http.ResponseWriter, r *http.Request) {
		if p, ok := svc.Payment(r.PathValue("id")); ok {
			writeJSON(w, http.StatusOK, p)
			return
		}
		writeError(w, &payments.Error{Status: 404, Title: "Payment not found", Detail: "no payment " + r.PathValue("id")})
	})
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, svc.Stats()) })
	return recoverer(mux)
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

func writeError(w http.ResponseWriter, err error) {
	var pe *payments.Error
	if !errors.As(err, &pe) {
		pe = &payments.Error{Status: 500, Title: "Internal error", Detail: err.Error()}
	}
	w.Header().Set("Content-Type", payments.ProblemContentType)
	w.WriteHeader(pe.Status)
	_, _ = w.Write(pe.Problem())
}
