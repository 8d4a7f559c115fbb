package idemhttp_test

import (
	"fmt"
	"log"
	"net/http"

	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
)

// store is the application's [idem.Store]: memstore.New() for one process
// (github.com/idemkit/idem/stores/memstore), redisstore or mongostore for
// several instances. The example leaves it unset so that this module does not
// require a store module (a runnable example with a replay lives in
// tests/adapters/idemhttp).
var store idem.Store

// userID stands in for the app's authentication: the principal of r.
func userID(r *http.Request) string { return r.Header.Get("X-User-ID") }

func Example() {
	engine, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	idempotent := idemhttp.New(engine, idemhttp.WithScope(userID))
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"pay_1"}`)
	})))
	_ = mux // http.ListenAndServe(":8080", mux)
}
