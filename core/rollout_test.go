package idem

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// begin runs one request through e: the handler answers status, and the
// result is what the client got and whether the handler ran.
func begin(t *testing.T, e *Engine, keys []string, status int) (resp *Response, ran bool) {
	t.Helper()
	req := &Request{Method: http.MethodPost, Route: "/r", Path: "/r", Keys: keys, Principal: "u", Body: []byte("{}")}
	x, resp := e.Begin(context.Background(), req)
	if resp != nil {
		return resp, false
	}
	if x != nil {
		x.Finish(status, http.Header{})
	}
	return &Response{Status: status}, true
}

func TestKeyOptional(t *testing.T) {
	var mu sync.Mutex
	var kinds []EventKind
	hook := WithEventHook(func(_ context.Context, ev Event) { mu.Lock(); kinds = append(kinds, ev.Kind); mu.Unlock() })
	e, err := New(newScriptStore(0), WithKeyOptional(), hook)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if resp, ran := begin(t, e, nil, 201); !ran || resp.Status != 201 {
			t.Fatalf("no key under WithKeyOptional, try %d: ran=%v status %d; want the handler to run unprotected", i, ran, resp.Status)
		}
	}
	if resp, ran := begin(t, e, []string{"a b"}, 201); ran || resp.Status != 400 {
		t.Fatalf("malformed key under WithKeyOptional: ran=%v status %d; want 400", ran, resp.Status)
	}
	begin(t, e, []string{"k"}, 201)
	if resp, ran := begin(t, e, []string{"k"}, 201); ran || !resp.IsReplay() {
		t.Fatal("a request with a key is still protected under WithKeyOptional")
	}
	if len(kinds) < 2 || kinds[0] != EventUnprotected || kinds[1] != EventUnprotected || EventUnprotected.String() != "unprotected" {
		t.Fatalf("events %v; want two %q first", kinds, EventUnprotected)
	}

	strict, _ := New(newScriptStore(0))
	if resp, ran := begin(t, strict, nil, 201); ran || resp.Status != 400 {
		t.Fatalf("no key by default: ran=%v status %d; want 400", ran, resp.Status)
	}
}

func TestKeyValidator(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	e, err := New(newScriptStore(0), WithKeyValidator(func(k string) error {
		if !uuid.MatchString(k) {
			return errors.New("send a lowercase UUID")
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	resp, ran := begin(t, e, []string{"order-1"}, 201)
	if ran || resp.Status != 400 || !strings.Contains(string(resp.Body), "send a lowercase UUID") || !strings.Contains(string(resp.Body), "key-malformed") {
		t.Fatalf("key refused by the validator: ran=%v %d %s; want 400 key-malformed with the reason", ran, resp.Status, resp.Body)
	}
	// The validator sees the parsed key: an sf-string's quotes are gone.
	if _, ran := begin(t, e, []string{`"0b1e7a52-4f0c-4c6e-9d59-4d7b0d0c2a11"`}, 201); !ran {
		t.Fatal("a quoted UUID was refused")
	}
}

func TestStorePolicy(t *testing.T) {
	// Release validation failures too (Stripe stores nothing that failed before executing).
	e, err := New(newScriptStore(0), WithStorePolicy(func(status int) bool { return status < 400 || status == http.StatusPaymentRequired }))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		status int
		stored bool
	}{{201, true}, {402, true}, {400, false}, {404, false}, {500, false}} {
		key := []string{"k" + strconv.Itoa(tc.status)}
		begin(t, e, key, tc.status)
		resp, ran := begin(t, e, key, tc.status)
		if ran == tc.stored || tc.stored && !resp.IsReplay() {
			t.Errorf("status %d: retry ran=%v replayed=%v; want stored=%v", tc.status, ran, resp.IsReplay(), tc.stored)
		}
	}
	// The default policy is unchanged: 400 and 404 are stored.
	d, _ := New(newScriptStore(0))
	begin(t, d, []string{"k"}, 404)
	if resp, ran := begin(t, d, []string{"k"}, 404); ran || !resp.IsReplay() {
		t.Error("the default policy no longer stores a 404")
	}
}

func TestProblemRenderer(t *testing.T) {
	e, err := New(newScriptStore(0), WithProblemRenderer(func(p Problem) (string, []byte) {
		return "application/vnd.api+json", []byte(`{"errors":[{"code":"` + strings.TrimPrefix(p.Type, ProblemTypeBase) + `"}]}`)
	}))
	if err != nil {
		t.Fatal(err)
	}
	resp, _ := begin(t, e, nil, 201)
	if resp.Status != 400 || resp.Header.Get("Content-Type") != "application/vnd.api+json" || string(resp.Body) != `{"errors":[{"code":"key-missing"}]}` {
		t.Fatalf("missing key with a renderer: %d %q %s", resp.Status, resp.Header.Get("Content-Type"), resp.Body)
	}
	if resp := e.problems.inProgress; resp.Header.Get("Retry-After") == "" || resp.Status != 409 {
		t.Fatalf("409 with a renderer: %d, Retry-After %q; want idem's status and Retry-After kept", resp.Status, resp.Header.Get("Retry-After"))
	}
	if resp, err := DecodeResponse(e.problems.notStored(201, "/x/1")); err != nil || resp.Header.Get("Location") != "/x/1" || !strings.Contains(string(resp.Body), "response-not-stored") {
		t.Fatalf("410 with a renderer: %v %s", resp.Header, resp.Body)
	}
	d, _ := New(newScriptStore(0))
	if resp, _ := begin(t, d, nil, 201); resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("default Content-Type %q; want RFC 9457", resp.Header.Get("Content-Type"))
	}
}

func TestWithMethodsCanonical(t *testing.T) {
	e, err := New(newScriptStore(0), WithMethods("put", "Delete", "PURGE"))
	if err != nil {
		t.Fatal(err)
	}
	if !e.Covers("PUT") || !e.Covers("DELETE") || !e.Covers("PURGE") || e.Covers("put") {
		t.Fatal(`WithMethods("put", "Delete", "PURGE") must cover PUT, DELETE and PURGE`)
	}
	for _, bad := range []string{"", "PO ST", "GET/1"} {
		if _, err := New(newScriptStore(0), WithMethods(bad)); err == nil {
			t.Errorf("WithMethods(%q) was accepted", bad)
		}
	}
}
