package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/payments"
	"github.com/idemkit/idem/stores/memstore"
)

// TestConsoleMounted: with -console-token the net/http wiring serves the
// operator's console on /admin/idem/, behind its login; without it,
// nothing is there.
func TestConsoleMounted(t *testing.T) {
	store := memstore.New()
	defer func() { _ = store.Close() }()
	engine, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = engine.Close(context.Background()) }()
	for _, token := range []string{"console-token-0123456789", ""} {
		app := &payments.App{Config: payments.Config{ConsoleToken: token}, Engine: engine, Store: store,
			Service: payments.NewService(0, nil), Metrics: http.NotFoundHandler()}
		srv, err := nethttpServer(app)
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(srv.(*http.Server).Handler)
		c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := c.Get(ts.URL + "/admin/idem/")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		ts.Close()
		if token != "" && (resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/admin/idem/login") {
			t.Fatalf("GET /admin/idem/ = %d, Location %q; want the console's login", resp.StatusCode, resp.Header.Get("Location"))
		}
		if token == "" && resp.StatusCode != http.StatusNotFound {
			t.Fatalf("GET /admin/idem/ without -console-token = %d, want 404", resp.StatusCode)
		}
	}
}
