package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

type userKey struct{}

// auth stands in for the app's authentication: it stores the principal.
func auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, r.Header.Get("X-User-ID"))))
	})
}

func Example() {
	store := memstore.New()
	defer store.Close()
	engine, err := idem.New(store)
	if err != nil {
		panic(err)
	}
	idempotent := idemhttp.New(engine, idemhttp.WithScope(func(r *http.Request) string {
		s, _ := r.Context().Value(userKey{}).(string)
		return s
	}))
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", auth(idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`, charges)
	}))))

	for range 2 { // a retry of the same request
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(`{"amount":1999}`))
		req.Header.Set("X-User-ID", "alice")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		body, _ := io.ReadAll(rec.Body)
		fmt.Printf("%d %s replayed=%q\n", rec.Code, body, rec.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"id":"pay_1"} replayed=""
	// 201 {"id":"pay_1"} replayed="true"
	// charges: 1
}
