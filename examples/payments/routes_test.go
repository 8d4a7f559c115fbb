package main

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/idemkit/idem/examples/internal/payments"
)

// TestRoutes calls the handlers' logic every framework mounts, without a
// framework or idem: each operation's answer, its effect on the counters,
// and the in-memory signups table's unique constraint on email.
func TestRoutes(t *testing.T) {
	svc := payments.NewService(0, nil)
	routes := map[string]payments.Route{}
	for _, rt := range payments.Routes(svc) {
		routes[rt.Method+" "+rt.Path] = rt
	}
	call := func(route, param, body string) payments.Response {
		t.Helper()
		rt, ok := routes[route]
		if !ok {
			t.Fatalf("no route %s", route)
		}
		return rt.Handle(context.Background(), payments.Request{User: "alice", Param: param, Body: []byte(body)})
	}
	check := func(res payments.Response, status int, contentType string) {
		t.Helper()
		if res.Status != status || res.ContentType != contentType {
			t.Fatalf("%d %s %s, want %d %s", res.Status, res.ContentType, res.Body, status, contentType)
		}
	}
	problem := payments.ProblemContentType

	p := call("POST /v1/payments", "", `{"amount":1200,"currency":"eur"}`)
	check(p, http.StatusCreated, "application/json")
	var pay payments.Payment
	if err := json.Unmarshal(p.Body, &pay); err != nil || p.Location != "/v1/payments/"+pay.ID || pay.UserID != "alice" {
		t.Fatalf("payment %s, Location %q: %v", p.Body, p.Location, err)
	}
	check(call("GET /v1/payments/{id}", pay.ID, ""), http.StatusOK, "application/json")
	check(call("GET /v1/payments/{id}", "pay_nope", ""), http.StatusNotFound, problem)
	check(call("POST /v1/payments", "", `{"amount":`), http.StatusBadRequest, problem)
	check(call("POST /v1/payments", "", `{"amount":4000,"currency":"eur"}`), http.StatusPaymentRequired, problem)

	check(call("POST /v1/orders", "", `{"sku":"book","quantity":2}`), http.StatusCreated, "application/json")
	check(call("POST /v1/orders", "", `{"sku":"","quantity":2}`), http.StatusBadRequest, problem)
	check(call("POST /v1/stock/decrements", "", `{"sku":"pen","quantity":30}`), http.StatusOK, "application/json")
	check(call("POST /v1/stock/decrements", "", `{"sku":"pen","quantity":71}`), http.StatusConflict, problem)
	st := call("GET /v1/stock/{sku}", "pen", "")
	var s payments.Stock
	if err := json.Unmarshal(st.Body, &s); err != nil || s.Remaining != payments.InitialStock-30 {
		t.Fatalf("stock of pen: %s, want %d left", st.Body, payments.InitialStock-30)
	}
	check(call("POST /v1/emails", "", `{"to":"alice@example.com","subject":"hi"}`), http.StatusAccepted, "application/json")
	check(call("POST /v1/signups", "", `{"email":"alice@example.com"}`), http.StatusCreated, "application/json")
	check(call("POST /v1/signups", "", `{"email":"alice@example.com"}`), http.StatusConflict, problem)

	want := payments.Stats{Executions: 8, Orders: 1, StockDecrements: 1, EmailsSent: 1, Signups: 1}
	if got := svc.Stats(); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
}
