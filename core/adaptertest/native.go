package adaptertest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// Case names a behaviour the suite checks through a handler written in the
// framework's own API ([Config.Native]), because each framework expresses
// it its own way: returned errors, panics, header setters, streams, the
// request's context. The suite sends the requests and holds the
// assertions; the adapter's test writes only the handler and its mounting.
type Case int

// The native cases. Each handler calls [NativeMount.Executed] first, once
// per execution, then does what its case says.
const (
	// HandlerError: the handler ends with the framework's own error for
	// status 402 and the message "card declined" (Echo: return
	// echo.NewHTTPError(402, "card declined"); Fiber: return
	// fiber.NewError(402, "card declined"); Gin:
	// c.AbortWithStatusJSON(402, ...); net/http: http.Error). The answer is
	// stored and replayed.
	HandlerError Case = iota
	// PlainError: the handler fails with a plain error "database gone" that
	// the app answers with 500 (Echo and Fiber: return errors.New(...); Gin:
	// c.Error(err) with nothing written, answered 500 by an error
	// middleware the adapter's test mounts outside idem; net/http:
	// http.Error(w, ..., 500)). The key is released: a retry runs again.
	PlainError
	// Panic: the handler panics with "boom" before writing anything. The
	// framework's recovery answers 500 and the key is released; with
	// [NativeMount.RecoveryInside] the recovery sits between idem and the
	// handler.
	Panic
	// PanicAfterWrite: the handler writes 201 "written" (flushing it where
	// the framework can) and then panics with "boom". A client that got
	// the 201 must never see a second execution: its retries get 410
	// response-not-stored (or the 201's replay, when a recovery inside idem
	// swallowed the panic after a complete answer). Where the framework still holds the answer back
	// (fasthttp), recovery answers 500 and the key is released.
	PanicAfterWrite
	// HeaderLines: the handler adds [NativeMount.Lines] in order with the
	// framework's own header setter for adding a line (repeated names,
	// commas inside values, lower-case names, a spoofed replay marker and
	// sometimes more lines than idem.HeaderLines holds inline), then
	// answers 201 "body" as "text/plain; charset=utf-8". The outer
	// middleware (see [Config.Native]) sets x-request-id. The client sends
	// its key on a lower-case idempotency-key line.
	HeaderLines
	// Stream: the handler answers 200 text/event-stream with Location
	// /streams/1 and writes "data: 1\n\n", "data: 2\n\n", "data: 3\n\n",
	// flushing each, and waits for [NativeMount.Release] before the second.
	// The first event reaches the client before the handler ends.
	Stream
	// HangUp: the handler waits until the client has hung up, on its
	// request's context where the framework cancels it then (net/http
	// based), else on [NativeMount.Release], which the suite closes once
	// the client gave up; then it answers 201 "done after hang-up". The
	// answer is still recorded and replayed.
	HangUp
)

// String returns the case's name, used in subtest names.
func (c Case) String() string {
	return [...]string{"HandlerError", "PlainError", "Panic", "PanicAfterWrite", "HeaderLines", "Stream", "HangUp"}[c]
}

// NativeMount is what [Config.Native] serves.
type NativeMount struct {
	Engine *idem.Engine
	Case   Case
	// RecoveryInside mounts the framework's recovery middleware between
	// idem and the handler instead of outside idem.
	RecoveryInside bool
	// Variant is one of [Config.NativeVariants] ("" when there are none),
	// e.g. an app configuration to run every case under.
	Variant string
	// Lines are the response header lines, name and value, a [HeaderLines]
	// handler adds in order.
	Lines [][2]string
	// Executed must be called by the handler first, once per execution.
	Executed func()
	// Release is closed when a [Stream] handler may write its second event
	// and when a [HangUp] client has given up.
	Release <-chan struct{}
}

type native struct {
	cfg    Config
	client *http.Client
}

// runNative runs every native case (and the panics with the recovery on
// both sides of idem), once per variant.
func runNative(t *testing.T, cfg Config, client *http.Client) {
	if cfg.Native == nil {
		t.Fatal("Config.Native is nil: every adapter serves the native cases (see adaptertest.Case)")
	}
	n := &native{cfg: cfg, client: client}
	variants := cfg.NativeVariants
	if len(variants) == 0 {
		variants = []string{""}
	}
	for _, v := range variants {
		run := func(t *testing.T) {
			t.Run("HandlerError", func(t *testing.T) { n.handlerError(t, v) })
			t.Run("PlainError", func(t *testing.T) { n.plainError(t, v) })
			for _, inside := range []bool{false, true} {
				name := map[bool]string{false: "RecoveryOutside", true: "RecoveryInside"}[inside]
				t.Run("Panic/"+name, func(t *testing.T) { n.panic(t, v, inside) })
				t.Run("PanicAfterWrite/"+name, func(t *testing.T) { n.panicAfterWrite(t, v, inside) })
			}
			for _, pad := range []int{0, 40} { // 40: more lines than idem.HeaderLines holds inline
				t.Run(fmt.Sprintf("HeaderLines/pad=%d", pad), func(t *testing.T) { n.headerLines(t, v, pad) })
			}
			t.Run("Stream", func(t *testing.T) { n.stream(t, v) })
			t.Run("HangUp", func(t *testing.T) { n.hangUp(t, v) })
		}
		if v == "" {
			run(t)
		} else {
			t.Run(v, run)
		}
	}
}

// nativeServer is one mounted case.
type nativeServer struct {
	url      string
	runs     atomic.Int64
	release  chan struct{}
	released sync.Once
}

func (ns *nativeServer) Release() { ns.released.Do(func() { close(ns.release) }) }

func (n *native) serve(t *testing.T, m NativeMount) *nativeServer {
	t.Helper()
	store := n.cfg.NewStore(t)
	e, err := idem.New(store, idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_ = e.Close(ctx)
	})
	ns := &nativeServer{release: make(chan struct{})}
	m.Engine, m.Executed, m.Release = e, func() { ns.runs.Add(1) }, ns.release
	ns.url = n.cfg.Native(t, m)
	t.Cleanup(ns.Release) // registered after Native's: runs first, so no handler hangs a shutdown
	t.Cleanup(n.client.CloseIdleConnections)
	return ns
}

type nativeReply struct {
	status int
	header http.Header
	body   string
}

func (r nativeReply) replayed() bool { return r.header.Get(idem.ReplayedHeader) == "true" }

func (n *native) request(ctx context.Context, url, key string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(PrincipalHeader, "alice")
	if key != "" {
		req.Header.Set(idem.DefaultHeader, key)
	}
	return req
}

func (n *native) do(t *testing.T, req *http.Request) nativeReply {
	t.Helper()
	resp, err := n.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", req.Method, req.URL, err)
	}
	return nativeReply{resp.StatusCode, resp.Header, string(b)}
}

func (n *native) post(t *testing.T, url, key string) nativeReply {
	t.Helper()
	return n.do(t, n.request(context.Background(), url, key))
}

func wantRuns(t *testing.T, ns *nativeServer, want int64) {
	t.Helper()
	if got := ns.runs.Load(); got != want {
		t.Fatalf("handler executions = %d, want %d", got, want)
	}
}

func (n *native) handlerError(t *testing.T, v string) {
	ns := n.serve(t, NativeMount{Case: HandlerError, Variant: v})
	first := n.post(t, ns.url, "k")
	second := n.post(t, ns.url, "k")
	if first.status != 402 || !strings.Contains(first.body, "card declined") || first.replayed() {
		t.Fatalf("the framework's 402 error: %d %q; want 402 with the message, answered by the framework", first.status, first.body)
	}
	if second.status != 402 || second.body != first.body || !second.replayed() {
		t.Fatalf("retry of a 402: %d %q replayed=%v; want the stored 402", second.status, second.body, second.replayed())
	}
	wantRuns(t, ns, 1)
}

func (n *native) plainError(t *testing.T, v string) {
	ns := n.serve(t, NativeMount{Case: PlainError, Variant: v})
	for i := range 2 {
		if got := n.post(t, ns.url, "k"); got.status != 500 || got.replayed() {
			t.Fatalf("plain error try %d: %d %q replayed=%v; want the app's 500, never a replay", i, got.status, got.body, got.replayed())
		}
	}
	wantRuns(t, ns, 2)
}

func (n *native) panic(t *testing.T, v string, inside bool) {
	ns := n.serve(t, NativeMount{Case: Panic, Variant: v, RecoveryInside: inside})
	for i := range 2 {
		if got := n.post(t, ns.url, "k"); got.status != 500 || got.replayed() {
			t.Fatalf("panic try %d: %d %q; want 500 from the framework's recovery (not 409), never a replay", i, got.status, got.body)
		}
	}
	wantRuns(t, ns, 2)
}

func (n *native) panicAfterWrite(t *testing.T, v string, inside bool) {
	ns := n.serve(t, NativeMount{Case: PanicAfterWrite, Variant: v, RecoveryInside: inside})
	resp, err := n.client.Do(n.request(context.Background(), ns.url, "late"))
	var first nativeReply
	if err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		first = nativeReply{resp.StatusCode, resp.Header, string(b)}
		if rerr != nil { // the connection was cut mid-body: the 201 was sent
			first.status = 201
		}
	} else {
		first.status = 201 // a cut connection: the server had begun the 201
	}
	second := n.post(t, ns.url, "late")
	switch first.status {
	case 201:
		gone := second.status == 410 && strings.Contains(second.body, "response-not-stored")
		replay := second.status == 201 && second.body == first.body // a recovery inside idem let the answer complete
		if !second.replayed() || !gone && !replay {
			t.Fatalf("retry after a panic that followed a sent 201: %d %q; want 410 response-not-stored (or the 201's replay), never a second execution", second.status, second.body)
		}
		wantRuns(t, ns, 1)
	case 500:
		if second.status != 500 || second.replayed() {
			t.Fatalf("retry after a panic the client saw as 500: %d %q; want a second execution (500 again)", second.status, second.body)
		}
		wantRuns(t, ns, 2)
	default:
		t.Fatalf("panic after writing 201: the client got %d %q; want the 201 or the recovery's 500", first.status, first.body)
	}
}

func (n *native) headerLines(t *testing.T, v string, pad int) {
	lines := [][2]string{
		{"Link", `</a>; rel="next", </b>; rel="prev"`},
		{"x-lower-case", ","},
		{"Link", `</c>; rel="last"`},
		{"idempotent-replayed", "false"},
	}
	for i := range pad {
		lines = append(lines, [2]string{"x-pad", strconv.Itoa(i)})
	}
	ns := n.serve(t, NativeMount{Case: HeaderLines, Variant: v, Lines: lines})
	send := func(id string) nativeReply {
		req := n.request(context.Background(), ns.url, "")
		req.Header["idempotency-key"] = []string{"k"} // sent as is, lower case
		req.Header.Set("X-Request-Id", id)
		return n.do(t, req)
	}
	first, second := send("r1"), send("r2")
	if first.status != 201 || first.body != "body" || !second.replayed() || second.status != 201 || second.body != "body" {
		t.Fatalf("first %d %q, retry %d %q replayed=%v; want 201 body, then its replay", first.status, first.body, second.status, second.body, second.replayed())
	}
	for _, name := range []string{"Link", "X-Lower-Case", "Content-Type", "X-Pad"} {
		got, want := second.header.Values(name), first.header.Values(name)
		if !reflect.DeepEqual(got, want) || len(want) == 0 && (name != "X-Pad" || pad > 0) {
			t.Fatalf("%s replayed as %q, sent as %q", name, got, want)
		}
	}
	if got := first.header.Values("X-Pad"); len(got) != pad {
		t.Fatalf("first answer's x-pad lines = %d, want %d", len(got), pad)
	}
	if got := second.header.Values("Link"); len(got) != 2 || got[0] != `</a>; rel="next", </b>; rel="prev"` || got[1] != `</c>; rel="last"` {
		t.Fatalf("replayed Link lines = %q; want both, in order, the comma inside the first kept", got)
	}
	if got := second.header.Values("X-Lower-Case"); !reflect.DeepEqual(got, []string{","}) {
		t.Fatalf("replayed x-lower-case = %q, want [\",\"]", got)
	}
	if got := second.header.Values("X-Request-Id"); !reflect.DeepEqual(got, []string{"r2"}) {
		t.Fatalf("replay's request id lines = %q, want the retry's [r2] (set outside idem)", got)
	}
	if got := second.header.Values(idem.ReplayedHeader); !reflect.DeepEqual(got, []string{"true"}) {
		t.Fatalf("replay marker lines = %q, want [true] (the handler's own line is not replayed)", got)
	}
	wantRuns(t, ns, 1)
}

func (n *native) stream(t *testing.T, v string) {
	ns := n.serve(t, NativeMount{Case: Stream, Variant: v})
	resp, err := n.client.Do(n.request(context.Background(), ns.url, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: 1\n" { // blocks if the adapter holds the stream back
		t.Fatalf("first event before the handler ended: %q %v", line, err)
	}
	gone := func(when string) {
		t.Helper()
		got := n.post(t, ns.url, "s")
		var p idem.Problem
		_ = json.Unmarshal([]byte(got.body), &p)
		if got.status != 410 || !got.replayed() || p.Type != idem.ProblemTypeBase+"response-not-stored" ||
			p.OriginalStatus != 200 || got.header.Get("Location") != "/streams/1" {
			t.Fatalf("retry %s a stream the framework writes after idem returned: %d %q Location %q; want 410 response-not-stored for a 200",
				when, got.status, got.body, got.header.Get("Location"))
		}
	}
	if n.cfg.NativeStreamGone {
		gone("during")
	} else if got := n.post(t, ns.url, "s"); got.status != 409 {
		t.Fatalf("retry during the stream: %d %q, want 409 in-progress", got.status, got.body)
	}
	ns.Release()
	rest, err := io.ReadAll(br)
	full := "data: 1\n" + string(rest)
	if err != nil || full != "data: 1\n\ndata: 2\n\ndata: 3\n\n" {
		t.Fatalf("stream = %q (%v)", full, err)
	}
	if n.cfg.NativeStreamGone {
		gone("after")
	} else {
		got := n.post(t, ns.url, "s")
		if got.status != 200 || got.body != full || !got.replayed() || got.header.Get("Content-Type") != "text/event-stream" ||
			got.header.Get("Location") != "/streams/1" {
			t.Fatalf("retry after the stream: %d %q %q; want the whole stream replayed", got.status, got.body, got.header.Get("Content-Type"))
		}
	}
	wantRuns(t, ns, 1)
}

func (n *native) hangUp(t *testing.T, v string) {
	ns := n.serve(t, NativeMount{Case: HangUp, Variant: v})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // hang up once the handler runs (not on a timer a loaded machine can beat)
		for deadline := time.Now().Add(2 * time.Minute); ns.runs.Load() == 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		}
		cancel()
	}()
	resp, err := n.client.Do(n.request(ctx, ns.url, "gone"))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("the client got %d; want it to have given up", resp.StatusCode)
	}
	ns.Release()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got := n.post(t, ns.url, "gone")
		if got.status == 201 && got.replayed() && got.body == "done after hang-up" {
			break
		}
		if got.status != 409 || time.Now().After(deadline) {
			t.Fatalf("retry after the client hung up: %d %q; want 409 until the handler ends, then its replay", got.status, got.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wantRuns(t, ns, 1)
}
