package idem

import (
	"context"
	"testing"
	"time"
)

type nopStore struct{ Store }

func TestNewValidates(t *testing.T) {
	if _, err := New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	for name, opt := range map[string]Option{
		"lease":     WithLease(0),
		"retention": WithRetention(-time.Second),
		"timeout":   WithStoreTimeout(0),
		"wait":      WithWait(-1),
		"body":      WithMaxBodyBytes(0),
		"response":  WithMaxResponseBytes(0),
		"header":    WithHeader(""),
	} {
		if _, err := New(nopStore{}, opt); err == nil {
			t.Errorf("New with an invalid %s succeeded", name)
		}
	}
	e, err := New(nopStore{}, WithMethods("PUT", "GET"), WithHeader("x-request-key"))
	if err != nil {
		t.Fatal(err)
	}
	if !e.Covers("POST") || !e.Covers("PATCH") || !e.Covers("PUT") || e.Covers("GET") || e.Covers("DELETE") {
		t.Error("covered methods are wrong")
	}
	if e.Header() != "X-Request-Key" {
		t.Errorf("Header() = %q", e.Header())
	}
	if x, resp := e.Begin(context.Background(), &Request{Method: "GET"}); x != nil || resp != nil {
		t.Error("GET was not passed through")
	}
}
