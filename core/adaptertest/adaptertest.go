// Package adaptertest is the HTTP behaviour suite every idem adapter runs
// through its real framework, over a real loopback listener:
//
//	func TestBehaviour(t *testing.T) {
//		adaptertest.Run(t, adaptertest.Config{Mount: mount, Native: native, NewStore: newStore})
//	}
//
// It checks what a client sees: status codes, problem bodies, replayed bytes
// and header lines, the replay marker, execution counts, scope isolation,
// limits, panics, store outages and clients that hang up. Most checks run
// the suite's [App], a net/http handler bridged into the framework; the
// native cases ([Case]) run handlers the adapter's test writes in the
// framework's own API (returned errors, recovery, header setters, streams,
// hang-ups), with the assertions kept here.
package adaptertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// Config tells Run how to serve the suite's [App] through the adapter.
type Config struct {
	// Mount serves m.App through the adapter's middleware built from
	// m.Engine, mounted as m.Where says, and returns the base URL
	// ("http://127.0.0.1:PORT", plus "/g" for [Group] and [Twice]) of a real listener it
	// stops in t.Cleanup. It must route every method on the paths /a, /b and
	// /skipped (under the base URL) to app, as three routes; pass m.Skip to
	// the adapter's skip predicate; return the [PrincipalHeader] value from
	// the adapter's scope function; mount the framework's own recovery
	// middleware so that a panic in app answers 500; and mount, outside idem,
	// a middleware of the framework that sets the response header lines
	// [OuterHeaders] returns for each request, as CORS and request-id
	// middleware do.
	Mount func(t *testing.T, m Mount) string
	// NewStore returns a fresh store for each subtest (usually memstore).
	NewStore func(t *testing.T) idem.Store
	// SkipStreaming skips the check that a flushed chunk reaches the client
	// before the handler ends, with this reason, for adapters whose test
	// mounting of App (an http.Handler) buffers; such adapters must test
	// their framework's native streaming themselves.
	SkipStreaming string
	// Native serves one native [Case] and returns the URL of its route: the
	// handler m.Case describes, written in the framework's own API, on the
	// route POST /x behind the adapter built from m.Engine (mounted per
	// route, scope from [PrincipalHeader]), over a real listener it stops
	// in t.Cleanup. Outside idem it mounts the framework's recovery
	// middleware (between idem and the handler when m.RecoveryInside) and a
	// middleware that copies the request's X-Request-Id into the response
	// as x-request-id (lower case where the framework keeps the case).
	// Required.
	Native func(t *testing.T, m NativeMount) string
	// NativeVariants, if set, runs every native case once per name, passed
	// as [NativeMount.Variant] (e.g. Fiber with and without header
	// normalising).
	NativeVariants []string
	// NativeStreamGone says that the framework writes a [Stream] after the
	// middleware returned (Fiber's body stream writers), so it cannot be
	// captured: retries, during and after the stream, get 410
	// response-not-stored with the original status and Location, never the
	// stream and never a second execution.
	NativeStreamGone bool
	// Unsupported maps the names of suite checks the adapter does not pass
	// yet ("OuterHeadersNotReplayed", "Group/ScopeByPrincipalAndRoute") to
	// the reason; each is reported skipped with it. It is for an adapter
	// catching up with a newly added check, never for a permanent gap.
	Unsupported map[string]string
}

// Where says where Mount mounts the adapter's middleware.
type Where int

// The mounts every adapter must support.
const (
	// PerRoute mounts it on each route: r.POST("/a", idem, app).
	PerRoute Where = iota
	// Group mounts it on a group with the prefix /g holding the routes
	// (r.Group("/g", idem)); Mount returns the URL ending in /g.
	Group
	// Global mounts it on the whole router (r.Use(idem)), so it also sees
	// requests no route matches; those must pass through (404 stays 404).
	Global
	// Twice mounts the same middleware (same engine) both on the whole
	// router and again on the group /g holding the routes, as an app that
	// protects everything and then, by mistake or habit, a group too
	// (r.Use(idem); r.Group("/g", idem)); Mount returns the URL ending in
	// /g. The handler must run once per key, recorded by the outer mount.
	Twice
	// Nested wraps each route's handler twice in the middleware (same
	// engine): r.POST("/a", idem, idem, app), or idem(idem(app)) on
	// net/http.
	Nested
)

// String returns the mount's name (PerRoute, Group, Global, Twice, Nested), used in subtest names.
func (w Where) String() string {
	return [...]string{"PerRoute", "Group", "Global", "Twice", "Nested"}[w]
}

// Mount is what Config.Mount mounts.
type Mount struct {
	Engine *idem.Engine
	App    http.Handler
	Where  Where
	// Skip is the adapter's skip predicate in the framework's terms, given
	// the request path: requests for which it returns true must pass
	// through untouched.
	Skip func(path string) bool
}

// OuterHeaders returns the response header lines the suite's outer
// middleware sets for a request carrying the given Origin and X-Request-Id
// header values (empty values set nothing): Access-Control-Allow-Origin =
// origin, X-Request-Id = requestID, and X-Outer: outer on every response (the
// App overrides that one with ?override=1).
func OuterHeaders(origin, requestID string) http.Header {
	h := http.Header{"X-Outer": {"outer"}}
	if origin != "" {
		h.Set("Access-Control-Allow-Origin", origin)
	}
	if requestID != "" {
		h.Set("X-Request-Id", requestID)
	}
	return h
}

type suite struct {
	cfg    Config
	where  Where
	client *http.Client
}

// Run runs the behaviour suite: all of it with the middleware mounted per
// route, and the checks that depend on the mount again in a group and
// globally.
func Run(t *testing.T, cfg Config) {
	s := &suite{cfg: cfg, client: &http.Client{
		Timeout:       20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"MissingKey", s.testMissingKey},
		{"MalformedKeys", s.testMalformedKeys},
		{"SFStringAndBareTokenNameOneKey", s.testSFString},
		{"ExecuteThenReplay", s.testExecuteThenReplay},
		{"KeyReusedWithOtherPayload", s.testMismatch},
		{"ConcurrentDuplicates", s.testConcurrent},
		{"ScopeByPrincipalAndRoute", s.testScope},
		{"NoPrincipal", s.testNoPrincipal},
		{"UncoveredMethodsPassThrough", s.testPassThrough},
		{"BodyLimit", s.testBodyLimit},
		{"StatusPolicy", s.testStatusPolicy},
		{"Panic", s.testPanic},
		{"PanicAfterResponseSent", s.testPanicAfterSend},
		{"StoreDown", s.testStoreDown},
		{"ClientGoneMidRequest", s.testClientGone},
		{"BinaryBody", s.testBinary},
		{"ResponseOverLimit", s.testResponseOverLimit},
		{"ResponseOverStoreLimit", s.testStoreLimit},
		{"CompletionRetried", s.testCompletionRetried},
		{"SpoofedReplayHeader", s.testSpoofedHeader},
		{"WaitMode", s.testWait},
		{"SlowHandlerKeepsLease", s.testLeaseRenewal},
		{"Streaming", s.testStreaming},
		{"OuterHeadersNotReplayed", s.testOuterHeaders},
		{"StoredHeadersAllowlist", s.testStoredHeaders},
		{"Skip", s.testSkip},
		{"UnmatchedRoutePassesThrough", s.testUnmatched},
		{"TransactionalUnitInHandlerContext", s.testTransactionalUnit},
		{"KeyOptional", s.testKeyOptional},
		{"ProblemRenderer", s.testProblemRenderer},
		{"ReplayCheck", s.testReplayCheck},
		{"FingerprintFunctions", s.testFingerprints},
		{"UncertainAfterCrash", s.testUncertain},
		{"Tombstones", s.testTombstones},
		{"Steps", s.testSteps},
		{"StepUncertainAnswered", s.testStepUncertainAnswer},
		{"Recovery", s.testRecovery},
	}
	for _, tt := range tests {
		t.Run(tt.name, s.unlessUnsupported(tt.name, tt.fn))
	}
	t.Run("Native", func(t *testing.T) { runNative(t, cfg, s.client) })
	for _, where := range []Where{Group, Global} {
		m := &suite{cfg: cfg, where: where, client: s.client}
		t.Run(where.String(), func(t *testing.T) {
			for _, tt := range []struct {
				name string
				fn   func(*testing.T)
			}{
				{"ExecuteThenReplay", m.testExecuteThenReplay},
				{"ScopeByPrincipalAndRoute", m.testScope},
				{"UncoveredMethodsPassThrough", m.testPassThrough},
				{"OuterHeadersNotReplayed", m.testOuterHeaders},
				{"Skip", m.testSkip},
				{"UnmatchedRoutePassesThrough", m.testUnmatched},
			} {
				t.Run(tt.name, s.unlessUnsupported(where.String()+"/"+tt.name, tt.fn))
			}
		})
	}
	for _, where := range []Where{Twice, Nested} { // mounted twice: one execution, recorded once
		m := &suite{cfg: cfg, where: where, client: s.client}
		t.Run(where.String(), func(t *testing.T) {
			for _, tt := range []struct {
				name string
				fn   func(*testing.T)
			}{
				{"ExecuteThenReplay", m.testExecuteThenReplay},
				{"KeyReusedWithOtherPayload", m.testMismatch},
				{"ConcurrentDuplicates", m.testConcurrent},
				{"StatusPolicy", m.testStatusPolicy},
				{"Panic", m.testPanic},
			} {
				t.Run(tt.name, s.unlessUnsupported(where.String()+"/"+tt.name, tt.fn))
			}
		})
	}
}

func (s *suite) unlessUnsupported(name string, fn func(*testing.T)) func(*testing.T) {
	reason, ok := s.cfg.Unsupported[name]
	if !ok {
		return fn
	}
	return func(t *testing.T) { t.Skip("unsupported by this adapter yet: " + reason) }
}

// serve mounts a fresh App behind an engine with opts.
func (s *suite) serve(t *testing.T, store idem.Store, opts ...idem.Option) (*App, string) {
	t.Helper()
	if store == nil {
		store = s.cfg.NewStore(t)
	}
	opts = append([]idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	e, err := idem.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // stop background releases and completion retries
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_ = e.Close(ctx)
	})
	app := NewApp()
	t.Cleanup(app.Release)
	base := strings.TrimSuffix(s.cfg.Mount(t, Mount{Engine: e, App: app, Where: s.where, Skip: skipped}), "/")
	t.Cleanup(s.client.CloseIdleConnections) // runs before Mount's cleanups: servers see the connections close
	return app, base
}

// skipped is the suite's skip predicate: the route /skipped is skipped.
func skipped(path string) bool { return strings.HasSuffix(path, "/skipped") }

type call struct {
	method, path, body, principal string
	keys                          []string // one header line each; nil means no header
	header                        http.Header
	ctx                           context.Context
}

type result struct {
	status int
	header http.Header
	body   []byte
}

func (s *suite) do(t *testing.T, base string, c call) result {
	t.Helper()
	r, err := s.send(base, c)
	if err != nil {
		t.Fatalf("%s %s: %v", c.method, c.path, err)
	}
	return r
}

func (s *suite) send(base string, c call) (result, error) {
	if c.method == "" {
		c.method = http.MethodPost
	}
	if c.principal == "" {
		c.principal = "alice"
	}
	ctx := c.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	req, err := http.NewRequestWithContext(ctx, c.method, base+c.path, strings.NewReader(c.body))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.principal != "-" {
		req.Header.Set(PrincipalHeader, c.principal)
	}
	for _, k := range c.keys {
		req.Header.Add(idem.DefaultHeader, k)
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, body}, err
}

func wantProblem(t *testing.T, r result, status int, typ string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json", ct)
	}
	var p idem.Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != status || p.Type != idem.ProblemTypeBase+typ || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem = %+v, want status %d type %s with title and detail", p, status, typ)
	}
}

func wantExecutions(t *testing.T, app *App, n int64) {
	t.Helper()
	if got := app.Executions(); got != n {
		t.Fatalf("handler executions = %d, want %d", got, n)
	}
}

func (s *suite) testMissingKey(t *testing.T) {
	app, base := s.serve(t, nil)
	wantProblem(t, s.do(t, base, call{path: "/a", body: `{}`}), 400, "key-missing")
	wantExecutions(t, app, 0)
}

func (s *suite) testMalformedKeys(t *testing.T) {
	app, base := s.serve(t, nil)
	cases := map[string][]string{
		"empty":              {""},
		"space inside":       {"ab cd"},
		"unterminated quote": {`"abc`},
		"empty sf-string":    {`""`},
		"too long":           {strings.Repeat("k", 256)},
		"two different":      {"k1", "k2"},
		"list of different":  {"k1, k2"},
		"parameters":         {`"abc";p=1`},
		"tab inside quotes":  {"\"a\tb\""},
	}
	for name, keys := range cases {
		r := s.do(t, base, call{path: "/a", body: `{}`, keys: keys})
		if r.status != 400 {
			t.Errorf("%s %q: status %d, want 400", name, keys, r.status)
		}
	}
	wantExecutions(t, app, 0)
	// Exactly 255 characters and a repeated identical line are fine.
	if r := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{strings.Repeat("k", 255)}}); r.status != 201 {
		t.Fatalf("255-character key: status %d", r.status)
	}
	if r := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"same", `"same"`}}); r.status != 201 {
		t.Fatalf("the same key on two lines: status %d", r.status)
	}
}

func (s *suite) testSFString(t *testing.T) {
	app, base := s.serve(t, nil)
	first := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{`"k-\\1"`}})
	second := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{`k-\1`}})
	if first.status != 201 || second.header.Get(idem.ReplayedHeader) != "true" || !bytes.Equal(first.body, second.body) {
		t.Fatalf("sf-string then bare token: %d, %d %q; want the second to replay the first", first.status, second.status, second.header.Get(idem.ReplayedHeader))
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testExecuteThenReplay(t *testing.T) {
	app, base := s.serve(t, nil)
	c := call{path: "/a?x=1&y=2", body: `{"amount":100}`, keys: []string{"pay-1"}}
	first := s.do(t, base, c)
	if first.status != 201 || first.header.Get(idem.ReplayedHeader) != "" {
		t.Fatalf("first: %d replayed=%q", first.status, first.header.Get(idem.ReplayedHeader))
	}
	if first.header.Get("Set-Cookie") == "" {
		t.Fatal("first response lost its Set-Cookie")
	}
	for i := 0; i < 3; i++ {
		c.path = "/a?y=2&x=1" // query order does not change the fingerprint
		r := s.do(t, base, c)
		if r.status != 201 || !bytes.Equal(r.body, first.body) {
			t.Fatalf("replay %d: %d %s; want 201 %s", i, r.status, r.body, first.body)
		}
		if r.header.Get(idem.ReplayedHeader) != "true" {
			t.Fatalf("replay lacks %s: true", idem.ReplayedHeader)
		}
		for _, h := range []string{"Location", "Content-Type", "X-Multi"} {
			if !reflect.DeepEqual(r.header.Values(h), first.header.Values(h)) {
				t.Fatalf("replayed %s = %q, want %q", h, r.header.Values(h), first.header.Values(h))
			}
		}
		if r.header.Get("Set-Cookie") != "" {
			t.Fatal("Set-Cookie was replayed")
		}
	}
	var got struct {
		BodySHA string `json:"body_sha256"`
	}
	if err := json.Unmarshal(first.body, &got); err != nil || got.BodySHA != sha(`{"amount":100}`) {
		t.Fatalf("the handler read body sha %q (%v), want the original body's", got.BodySHA, err)
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testMismatch(t *testing.T) {
	app, base := s.serve(t, nil)
	first := s.do(t, base, call{path: "/a", body: `{"amount":100}`, keys: []string{"k"}})
	wantProblem(t, s.do(t, base, call{path: "/a", body: `{"amount":999}`, keys: []string{"k"}}), 422, "key-reused")
	wantProblem(t, s.do(t, base, call{path: "/a?extra=1", body: `{"amount":100}`, keys: []string{"k"}}), 422, "key-reused")
	again := s.do(t, base, call{path: "/a", body: `{"amount":100}`, keys: []string{"k"}})
	if again.status != 201 || !bytes.Equal(again.body, first.body) {
		t.Fatalf("original request after a mismatch: %d %s; want the stored replay", again.status, again.body)
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testConcurrent(t *testing.T) {
	app, base := s.serve(t, nil)
	const n = 20
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.send(base, call{path: "/a?sleep=300ms", body: `{}`, keys: []string{"double-click"}})
			if err != nil {
				t.Errorf("duplicate %d: %v", i, err)
				return
			}
			statuses[i] = r.status
			if r.status == 409 && r.header.Get("Retry-After") == "" {
				t.Errorf("409 without Retry-After")
			}
		}()
	}
	wg.Wait()
	created := 0
	for _, st := range statuses {
		switch st {
		case 201:
			created++
		case 409:
		default:
			t.Fatalf("statuses %v: want only 201 and 409", statuses)
		}
	}
	if created < 1 {
		t.Fatalf("statuses %v: no 201", statuses)
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testScope(t *testing.T) {
	app, base := s.serve(t, nil)
	a := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}, principal: "alice"})
	b := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}, principal: "bob"})
	r := s.do(t, base, call{path: "/b", body: `{}`, keys: []string{"k"}, principal: "alice"})
	if a.status != 201 || b.status != 201 || r.status != 201 || bytes.Equal(a.body, b.body) || bytes.Equal(a.body, r.body) {
		t.Fatalf("same key for two principals / routes shared a response: %s | %s | %s", a.body, b.body, r.body)
	}
	if b.header.Get(idem.ReplayedHeader) != "" || r.header.Get(idem.ReplayedHeader) != "" {
		t.Fatal("another principal or route got a replay")
	}
	wantExecutions(t, app, 3)
}

func (s *suite) testNoPrincipal(t *testing.T) {
	app, base := s.serve(t, nil)
	wantProblem(t, s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}, principal: "-"}), 401, "no-principal")
	wantExecutions(t, app, 0)

	app, base = s.serve(t, nil, idem.WithGlobalScope())
	if r := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}, principal: "-"}); r.status != 201 {
		t.Fatalf("global scope without principal: %d", r.status)
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testPassThrough(t *testing.T) {
	app, base := s.serve(t, nil)
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		for i := 0; i < 2; i++ {
			r := s.do(t, base, call{method: m, path: "/a?status=200", keys: []string{"k"}})
			if r.status != 200 || r.header.Get(idem.ReplayedHeader) != "" {
				t.Fatalf("%s: %d replayed=%q; want a pass-through 200", m, r.status, r.header.Get(idem.ReplayedHeader))
			}
		}
	}
	wantExecutions(t, app, 6)
	// PUT is covered once opted in.
	app, base = s.serve(t, nil, idem.WithMethods(http.MethodPut))
	wantProblem(t, s.do(t, base, call{method: http.MethodPut, path: "/a"}), 400, "key-missing")
	s.do(t, base, call{method: http.MethodPut, path: "/a", keys: []string{"k"}})
	if r := s.do(t, base, call{method: http.MethodPut, path: "/a", keys: []string{"k"}}); r.header.Get(idem.ReplayedHeader) != "true" {
		t.Fatal("opted-in PUT was not replayed")
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testBodyLimit(t *testing.T) {
	app, base := s.serve(t, nil, idem.WithMaxBodyBytes(1024))
	wantProblem(t, s.do(t, base, call{path: "/a", body: strings.Repeat("x", 1025), keys: []string{"big"}}), 413, "body-too-large")
	wantExecutions(t, app, 0)
	atLimit := strings.Repeat("y", 1024)
	r := s.do(t, base, call{path: "/a", body: atLimit, keys: []string{"fits"}})
	if r.status != 201 || !bytes.Contains(r.body, []byte(sha(atLimit))) {
		t.Fatalf("body at the limit: %d %s; want 201 with the handler reading all of it", r.status, r.body)
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testStatusPolicy(t *testing.T) {
	app, base := s.serve(t, nil)
	var want int64
	for _, st := range []int{500, 502, 503, 408, 409, 425, 429} {
		for i := 0; i < 2; i++ {
			r := s.do(t, base, call{path: "/a?status=" + itoa(st), body: `{}`, keys: []string{"released-" + itoa(st)}})
			want++
			if r.status != st || r.header.Get(idem.ReplayedHeader) != "" {
				t.Fatalf("status %d try %d: got %d replayed=%q; want the handler to run again", st, i, r.status, r.header.Get(idem.ReplayedHeader))
			}
		}
	}
	for _, st := range []int{200, 202, 204, 302, 400, 402, 404, 422} {
		first := s.do(t, base, call{path: "/a?status=" + itoa(st), body: `{}`, keys: []string{"stored-" + itoa(st)}})
		want++
		second := s.do(t, base, call{path: "/a?status=" + itoa(st), body: `{}`, keys: []string{"stored-" + itoa(st)}})
		if second.status != st || second.header.Get(idem.ReplayedHeader) != "true" || !bytes.Equal(first.body, second.body) {
			t.Fatalf("status %d: retry got %d replayed=%q; want the stored response", st, second.status, second.header.Get(idem.ReplayedHeader))
		}
	}
	wantExecutions(t, app, want)

	app, base = s.serve(t, nil, idem.WithStoreAll())
	s.do(t, base, call{path: "/a?status=500", body: `{}`, keys: []string{"k"}})
	if r := s.do(t, base, call{path: "/a?status=500", body: `{}`, keys: []string{"k"}}); r.status != 500 || r.header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("WithStoreAll: retry of a 500 got %d replayed=%q", r.status, r.header.Get(idem.ReplayedHeader))
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testPanic(t *testing.T) {
	app, base := s.serve(t, nil)
	for i := 0; i < 2; i++ {
		if r := s.do(t, base, call{path: "/a?panic=1", body: `{}`, keys: []string{"boom"}}); r.status != 500 {
			t.Fatalf("panic try %d: status %d, want 500 from the framework's recovery (not 409)", i, r.status)
		}
	}
	wantExecutions(t, app, 2)
}

func (s *suite) testPanicAfterSend(t *testing.T) {
	if s.cfg.SkipStreaming != "" {
		t.Skip("the mounted App's response is buffered, so it is not sent before the panic: " + s.cfg.SkipStreaming)
	}
	app, base := s.serve(t, nil)
	first, err := s.send(base, call{path: "/a?panicafter=1", body: `{}`, keys: []string{"late-panic"}})
	if err == nil && first.status != 201 {
		t.Fatalf("first: %d, want the 201 sent before the panic (or a cut connection)", first.status)
	}
	r := s.do(t, base, call{path: "/a?panicafter=1", body: `{}`, keys: []string{"late-panic"}})
	wantProblem(t, r, 410, "response-not-stored")
	wantExecutions(t, app, 1)
}

func (s *suite) testStoreDown(t *testing.T) {
	app, base := s.serve(t, downStore{})
	r := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}})
	wantProblem(t, r, 503, "store-unavailable")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	wantExecutions(t, app, 0)
	if r := s.do(t, base, call{method: http.MethodGet, path: "/a?status=200"}); r.status != 200 {
		t.Fatalf("GET with the store down: %d, want 200 (not covered)", r.status)
	}

	app, base = s.serve(t, downStore{}, idem.WithFailOpen())
	if r := s.do(t, base, call{path: "/a", body: `{"x":1}`, keys: []string{"k"}}); r.status != 201 || !bytes.Contains(r.body, []byte(sha(`{"x":1}`))) {
		t.Fatalf("fail-open: %d %s; want the handler to run with the full body", r.status, r.body)
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testClientGone(t *testing.T) {
	app, base := s.serve(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		_, err := s.send(base, call{path: "/a?hold=1", body: `{}`, keys: []string{"gone"}, ctx: ctx})
		sent <- err
	}()
	for deadline := time.Now().Add(2 * time.Minute); app.Executions() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the handler did not start within 2 minutes")
		}
	}
	cancel() // the client hangs up while the handler runs
	if err := <-sent; err == nil {
		t.Fatal("the client was supposed to give up")
	}
	app.Release()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r := s.do(t, base, call{path: "/a?hold=1", body: `{}`, keys: []string{"gone"}})
		if r.status == 201 && r.header.Get(idem.ReplayedHeader) == "true" {
			break
		}
		if r.status != 409 || time.Now().After(deadline) {
			t.Fatalf("retry after the client left: %d %s; want 409 then the stored replay", r.status, r.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testBinary(t *testing.T) {
	app, base := s.serve(t, nil)
	first := s.do(t, base, call{path: "/a?bytes=3000&status=200", body: `{}`, keys: []string{"bin"}})
	second := s.do(t, base, call{path: "/a?bytes=3000&status=200", body: `{}`, keys: []string{"bin"}})
	if !bytes.Equal(first.body, Pattern(3000)) || !bytes.Equal(second.body, Pattern(3000)) || second.header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("binary replay differs: %d bytes then %d bytes", len(first.body), len(second.body))
	}
	if second.header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("replayed Content-Type %q", second.header.Get("Content-Type"))
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testResponseOverLimit(t *testing.T) {
	app, base := s.serve(t, nil, idem.WithMaxResponseBytes(1000))
	first := s.do(t, base, call{path: "/a?bytes=5000", body: `{}`, keys: []string{"huge"}})
	if first.status != 201 || !bytes.Equal(first.body, Pattern(5000)) {
		t.Fatalf("first caller got %d with %d bytes; want all 5000", first.status, len(first.body))
	}
	r := s.do(t, base, call{path: "/a?bytes=5000", body: `{}`, keys: []string{"huge"}})
	wantProblem(t, r, 410, "response-not-stored")
	var p idem.Problem
	_ = json.Unmarshal(r.body, &p)
	if p.OriginalStatus != 201 || r.header.Get("Location") != first.header.Get("Location") || r.header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("not-stored replay: original_status %d Location %q replayed %q", p.OriginalStatus, r.header.Get("Location"), r.header.Get(idem.ReplayedHeader))
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testStoreLimit(t *testing.T) {
	app, base := s.serve(t, smallStore{s.cfg.NewStore(t)})
	first := s.do(t, base, call{path: "/a?bytes=5000", body: `{}`, keys: []string{"huge"}})
	if first.status != 201 || len(first.body) != 5000 {
		t.Fatalf("first caller got %d with %d bytes; want all 5000", first.status, len(first.body))
	}
	wantProblem(t, s.do(t, base, call{path: "/a?bytes=5000", body: `{}`, keys: []string{"huge"}}), 410, "response-not-stored")
	wantExecutions(t, app, 1)
}

func (s *suite) testCompletionRetried(t *testing.T) {
	flaky := &flakyStore{Store: s.cfg.NewStore(t)}
	flaky.failures.Store(3)
	app, base := s.serve(t, flaky)
	first := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}})
	if first.status != 201 {
		t.Fatalf("first: %d", first.status)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}})
		if r.status == 201 && r.header.Get(idem.ReplayedHeader) == "true" && bytes.Equal(r.body, first.body) {
			break
		}
		if r.status != 409 || time.Now().After(deadline) {
			t.Fatalf("while the store fails completions: retry got %d %s; want 409 until the background retry stores the response", r.status, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantExecutions(t, app, 1)

	// Without background retries (one immediate retry only) the key stays
	// in progress until its lease lapses.
	flaky = &flakyStore{Store: s.cfg.NewStore(t)}
	flaky.failures.Store(2)
	app, base = s.serve(t, flaky, idem.WithCompletionRetry(0))
	s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}})
	wantProblem(t, s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}}), 409, "in-progress")
	wantExecutions(t, app, 1)
}

// flakyStore fails the next failures calls of Complete, like a store
// connection that drops once.
type flakyStore struct {
	idem.Store
	failures atomic.Int32
}

func (s *flakyStore) Complete(ctx context.Context, key, token string, resp []byte, retention time.Duration) error {
	if s.failures.Add(-1) >= 0 {
		return errDown
	}
	return s.Store.Complete(ctx, key, token, resp, retention)
}

// txStore makes a store Transactional with units that remember how the
// engine ended them.
type txStore struct{ idem.Store }

func (s txStore) Unit(key, token string) idem.Unit {
	return &txUnit{s: s.Store, key: key, token: token}
}

type txUnit struct {
	s          idem.Store
	key, token string
	ended      atomic.Pointer[string]
}

func (u *txUnit) Complete(ctx context.Context, resp []byte, retention time.Duration) error {
	end := "complete"
	u.ended.Store(&end)
	return u.s.Complete(ctx, u.key, u.token, resp, retention)
}

func (u *txUnit) Release(ctx context.Context) error {
	end := "release"
	u.ended.Store(&end)
	return u.s.Release(ctx, u.key, u.token)
}

// testTransactionalUnit checks that the adapter binds the execution's
// [idem.Unit] into the handler's context (Execution.WithInfo), where
// stores such as pgstore find the handler's transaction, and that the
// engine ends the execution through that Unit: completed when stored,
// released after a panic or a 5xx.
func (s *suite) testTransactionalUnit(t *testing.T) {
	app, base := s.serve(t, txStore{s.cfg.NewStore(t)})
	for _, c := range []struct{ path, key, want string }{
		{"/a", "tx-stored", "complete"},
		{"/a?panic=1", "tx-panic", "release"},
		{"/a?status=503", "tx-5xx", "release"},
	} {
		s.do(t, base, call{path: c.path, body: `{}`, keys: []string{c.key}})
		if app.lastInfo.Load() == nil {
			t.Fatalf("%s: the mounted App's request context carries no idem.Info; the adapter must hand the handler Execution.WithInfo's context (Fiber: copy it into Locals)", c.path)
		}
		ref := app.lastUnit.Load()
		if ref == nil || ref.u == nil {
			t.Fatalf("%s: the handler's context carries no idem.Unit; bind it with Execution.WithInfo", c.path)
		}
		u, ok := ref.u.(*txUnit)
		if !ok {
			t.Fatalf("%s: the handler's Unit is a %T, not the store's", c.path, ref.u)
		}
		if end := u.ended.Load(); end == nil || *end != c.want {
			t.Fatalf("%s: the engine ended the unit with %v; want %s", c.path, end, c.want)
		}
	}
}

// smallStore is a store whose records hold responses of at most 2000 bytes, like
// MongoDB's 16 MiB document limit in miniature.
type smallStore struct{ idem.Store }

func (s smallStore) Complete(ctx context.Context, key, token string, resp []byte, retention time.Duration) error {
	if len(resp) > 2000 {
		return fmt.Errorf("smallStore: %w", idem.ErrTooLarge)
	}
	return s.Store.Complete(ctx, key, token, resp, retention)
}

func (s *suite) testSpoofedHeader(t *testing.T) {
	app, base := s.serve(t, nil)
	spoof := http.Header{idem.ReplayedHeader: {"true"}}
	r := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}, header: spoof})
	if r.status != 201 || r.header.Get(idem.ReplayedHeader) != "" {
		t.Fatalf("a client-sent %s changed the answer: %d %q", idem.ReplayedHeader, r.status, r.header.Get(idem.ReplayedHeader))
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testWait(t *testing.T) {
	app, base := s.serve(t, nil, idem.WithWait(5*time.Second))
	var wg sync.WaitGroup
	results := make([]result, 5)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.send(base, call{path: "/a?sleep=300ms", body: `{}`, keys: []string{"wait"}})
			if err != nil {
				t.Errorf("waiting duplicate: %v", err)
			}
			results[i] = r
		}()
	}
	wg.Wait()
	for _, r := range results {
		if r.status != 201 || !bytes.Equal(r.body, results[0].body) {
			t.Fatalf("wait mode: got %d %s; want every duplicate to get the one 201", r.status, r.body)
		}
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testStreaming(t *testing.T) {
	if s.cfg.SkipStreaming != "" {
		t.Skip(s.cfg.SkipStreaming)
	}
	app, base := s.serve(t, nil)
	req, _ := http.NewRequest(http.MethodPost, base+"/a?stream=1", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(PrincipalHeader, "alice")
	req.Header.Set(idem.DefaultHeader, "stream")
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	chunk := make([]byte, len(`{"execution":1,`))
	if _, err := io.ReadFull(resp.Body, chunk); err != nil { // blocks if the adapter holds the stream back
		t.Fatalf("first chunk before the handler ended: %v", err)
	}
	app.Release()
	rest, _ := io.ReadAll(resp.Body)
	full := append(chunk, rest...)
	r := s.do(t, base, call{path: "/a?stream=1", body: `{}`, keys: []string{"stream"}})
	if r.status != 201 || !bytes.Equal(r.body, full) || r.header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("replay of a stream: %d %q; want the whole stream %q", r.status, r.body, full)
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testLeaseRenewal(t *testing.T) {
	const lease = 600 * time.Millisecond
	app, base := s.serve(t, nil, idem.WithLease(lease), idem.WithStoreTimeout(lease/4))
	slow := call{path: "/a?hold=1", body: `{}`, keys: []string{"slow"}}
	done := make(chan result, 1)
	go func() {
		r, err := s.send(base, slow)
		if err != nil {
			t.Errorf("slow request: %v", err)
		}
		done <- r
	}()
	for deadline := time.Now().Add(2 * time.Minute); app.Executions() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slow handler did not start within 2 minutes")
		}
	}
	time.Sleep(2 * lease) // the lease would have lapsed twice: only renewal keeps it
	wantProblem(t, s.do(t, base, slow), 409, "in-progress")
	app.Release()
	first := <-done
	r := s.do(t, base, slow)
	if first.status != 201 || r.header.Get(idem.ReplayedHeader) != "true" || !bytes.Equal(r.body, first.body) {
		t.Fatalf("after the slow handler: %d then %d; want 201 and its replay", first.status, r.status)
	}
	wantExecutions(t, app, 1)
}

// downStore is a store whose backend is unreachable.
type downStore struct{}

var errDown = errors.New("adaptertest: store unreachable")

func (downStore) Acquire(context.Context, string, string, string, time.Duration) (idem.Record, bool, error) {
	return idem.Record{}, false, errDown
}
func (downStore) Complete(context.Context, string, string, []byte, time.Duration) error {
	return errDown
}
func (downStore) Release(context.Context, string, string) error { return errDown }
func (downStore) Get(context.Context, string) (idem.Record, bool, error) {
	return idem.Record{}, false, errDown
}

func (s *suite) testOuterHeaders(t *testing.T) {
	app, base := s.serve(t, nil)
	exchange := func(origin, id, query string) result {
		return s.do(t, base, call{path: "/a" + query, body: `{}`, keys: []string{"cors" + query},
			header: http.Header{"Origin": {origin}, "X-Request-Id": {id}}})
	}
	first := exchange("https://a.example", "req-1", "")
	second := exchange("https://b.example", "req-2", "")
	if first.status != 201 || second.header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("first %d, second replayed=%q; want 201 then a replay", first.status, second.header.Get(idem.ReplayedHeader))
	}
	for h, want := range map[string]string{"Access-Control-Allow-Origin": "https://b.example", "X-Request-Id": "req-2", "X-Outer": "outer"} {
		if got := second.header.Values(h); len(got) != 1 || got[0] != want {
			t.Errorf("replayed %s = %q, want exactly %q (the outer middleware's, for this exchange)", h, got, want)
		}
	}
	if second.header.Get("Location") != first.header.Get("Location") || len(second.header.Values("X-Multi")) != 2 {
		t.Errorf("the handler's own headers were not replayed: Location %q, X-Multi %q", second.header.Get("Location"), second.header.Values("X-Multi"))
	}
	// A line the outer middleware set and the handler changed is replayed as
	// the first client got it.
	over := exchange("https://a.example", "req-3", "?override=1")
	r := exchange("https://b.example", "req-4", "?override=1")
	if got := r.header.Values("X-Outer"); !slices.Contains(got, "handler") || !slices.Equal(got, over.header.Values("X-Outer")) || r.header.Get("X-Request-Id") != "req-4" {
		t.Errorf("replay with a header the handler overrode: X-Outer %q (first answer %q), X-Request-Id %q; want the first answer's lines, req-4",
			got, over.header.Values("X-Outer"), r.header.Get("X-Request-Id"))
	}
	wantExecutions(t, app, 2)
}

func (s *suite) testStoredHeaders(t *testing.T) {
	app, base := s.serve(t, nil, idem.WithStoredHeaders("Location", "content-type"))
	first := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}})
	r := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}})
	if r.header.Get(idem.ReplayedHeader) != "true" || r.header.Get("Location") != first.header.Get("Location") ||
		r.header.Get("Content-Type") != "application/json" || r.header.Get("X-Multi") != "" {
		t.Fatalf("replay under WithStoredHeaders(Location, Content-Type): replayed %q Location %q Content-Type %q X-Multi %q",
			r.header.Get(idem.ReplayedHeader), r.header.Get("Location"), r.header.Get("Content-Type"), r.header.Values("X-Multi"))
	}
	wantExecutions(t, app, 1)
}

func (s *suite) testSkip(t *testing.T) {
	app, base := s.serve(t, nil)
	for i := 0; i < 2; i++ {
		r := s.do(t, base, call{path: "/skipped", body: `{}`, keys: []string{"k"}})
		if r.status != 201 || r.header.Get(idem.ReplayedHeader) != "" {
			t.Fatalf("skipped route, try %d: %d replayed=%q; want the handler to run each time", i, r.status, r.header.Get(idem.ReplayedHeader))
		}
	}
	if r := s.do(t, base, call{path: "/skipped", body: `{}`}); r.status != 201 {
		t.Fatalf("skipped route without a key: %d %s; want 201", r.status, r.body)
	}
	wantExecutions(t, app, 3)
	wantProblem(t, s.do(t, base, call{path: "/a", body: `{}`}), 400, "key-missing")
}

func (s *suite) testUnmatched(t *testing.T) {
	app, base := s.serve(t, nil)
	for _, keys := range [][]string{nil, {"k"}} {
		r := s.do(t, base, call{path: "/nope", body: `{}`, keys: keys})
		if r.status != 404 || strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
			t.Fatalf("POST to a route that does not exist (keys %q): %d %q %s; want the framework's 404", keys, r.status, r.header.Get("Content-Type"), r.body)
		}
	}
	wantExecutions(t, app, 0)
}

func (s *suite) testKeyOptional(t *testing.T) {
	app, base := s.serve(t, nil, idem.WithKeyOptional())
	for i := 0; i < 2; i++ {
		if r := s.do(t, base, call{path: "/a", body: `{}`}); r.status != 201 || r.header.Get(idem.ReplayedHeader) != "" {
			t.Fatalf("no key under WithKeyOptional, try %d: %d %s; want the handler to run", i, r.status, r.body)
		}
	}
	s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}})
	if r := s.do(t, base, call{path: "/a", body: `{}`, keys: []string{"k"}}); r.header.Get(idem.ReplayedHeader) != "true" {
		t.Fatal("a request with a key was not replayed under WithKeyOptional")
	}
	wantExecutions(t, app, 3)
}

func (s *suite) testProblemRenderer(t *testing.T) {
	app, base := s.serve(t, nil, idem.WithProblemRenderer(func(p idem.Problem) (string, []byte) {
		return "application/vnd.api+json", []byte(`{"errors":[{"status":"` + itoa(p.Status) + `","code":"` + strings.TrimPrefix(p.Type, idem.ProblemTypeBase) + `"}]}`)
	}))
	r := s.do(t, base, call{path: "/a", body: `{}`})
	if r.status != 400 || r.header.Get("Content-Type") != "application/vnd.api+json" || string(r.body) != `{"errors":[{"status":"400","code":"key-missing"}]}` {
		t.Fatalf("missing key with a problem renderer: %d %q %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	wantExecutions(t, app, 0)
}
