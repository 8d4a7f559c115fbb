package chaos

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tpclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/redisstore"
)

// The tests in this file drive an idem.Engine in-process (Begin, Write,
// Finish, Close) over redisstore and a real Redis behind toxiproxy, so that
// they can watch the engine's events and log lines while a fault hits one
// store call.

// engineRig is an engine over redisstore through a proxy to a Redis of the
// test's own; direct reaches the same Redis without the proxy. The client
// dials px until redial is set, then spare, a second proxy to the same
// Redis: a fault on px then hits only the connections already open.
type engineRig struct {
	t         *testing.T
	e         *idem.Engine
	px, spare *proxy
	redial    atomic.Bool
	direct    *redis.Client
	prefix    string

	mu     sync.Mutex
	events []idem.Event
	log    bytes.Buffer
}

func newEngineRig(t *testing.T, opts ...idem.Option) *engineRig {
	t.Helper()
	r := startRedis(t)
	rig := &engineRig{t: t, px: newProxy(t, r.Addr()), spare: newProxy(t, r.Addr()), direct: r.c, prefix: "idem:" + hexID() + ":"}
	first, second := rig.px.Addr(), rig.spare.Addr() // copies: the toxiproxy client rewrites its fields
	c := redis.NewClient(&redis.Options{
		// ContextTimeoutEnabled: the engine's store timeout reaches the
		// socket, as in the examples' store.go.
		ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			addr := first
			if rig.redial.Load() {
				addr = second
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	logger := slog.New(slog.NewTextHandler(lockedWriter{&rig.mu, &rig.log}, nil))
	opts = append([]idem.Option{
		idem.WithLogger(logger),
		idem.WithEventHook(func(_ context.Context, ev idem.Event) {
			rig.mu.Lock()
			defer rig.mu.Unlock()
			rig.events = append(rig.events, ev)
		}),
	}, opts...)
	e, err := idem.New(redisstore.New(c, redisstore.WithPrefix(rig.prefix)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	rig.e = e
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.Close(ctx)
	})
	// Warm up: a pooled connection exists and Redis has the scripts cached
	// (a fault must hit the script run, not go-redis's NOSCRIPT fallback).
	req, _ := rig.request()
	rig.begin(req).Finish(http.StatusCreated, nil)
	req, _ = rig.request()
	rig.begin(req).Fail()
	return rig
}

// request is one covered request with its own idempotency key.
func (rig *engineRig) request() (*idem.Request, string) {
	key, user := newKey(), "u"+hexID()
	req := &idem.Request{Method: http.MethodPost, Path: "/v1/payments", ContentType: "application/json",
		Keys: []string{key}, Principal: user, Body: []byte(`{"amount":1000}`)}
	return req, idem.ScopedKey(user, http.MethodPost, "/v1/payments", key)
}

// begin acquires req; it fails the test unless the handler may run.
func (rig *engineRig) begin(req *idem.Request) *idem.Execution {
	rig.t.Helper()
	x, resp := rig.e.Begin(context.Background(), req)
	if x == nil {
		rig.t.Fatalf("Begin: want an execution, got %v", resp)
	}
	return x
}

// waitState polls Redis directly until the record's state (the first byte
// of its value: "1" in progress, "2" completed, "" absent) is want or 30s
// pass.
func (rig *engineRig) waitState(scoped, want string) {
	rig.t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if st, _ := rig.direct.GetRange(ctx, rig.prefix+scoped, 0, 0).Result(); st == want {
			return
		}
	}
	rig.t.Fatalf("record never reached state %q within 30s", want)
}

// kinds returns the kinds of the events reported for scoped so far.
func (rig *engineRig) kinds(scoped string) []string {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	var out []string
	for _, ev := range rig.events {
		if ev.Key == scoped {
			s := ev.Kind.String()
			if ev.Err != nil {
				s += "(" + ev.Err.Error() + ")"
			}
			out = append(out, s)
		}
	}
	return out
}

func (rig *engineRig) logs() string {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	return rig.log.String()
}

// within waits for done, failing the test after limit.
func within(t *testing.T, done <-chan struct{}, limit time.Duration, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("%s did not return within %v", what, limit)
	}
}

// TestLandedCompletion loses the reply of a completion that Redis ran, on
// the connection it was sent on: the reply is held 3s with a 2s store
// timeout (a toxiproxy latency toxic), or the connection is cut after the
// script ran. The engine's next attempt, on a new connection, is refused
// (the record is no longer in progress); the engine must recognise its own
// completion and report "completed", not "lease-lost", and log nothing
// about a lost lease.
func TestLandedCompletion(t *testing.T) {
	for _, mode := range []string{"reply-held", "connection-dropped"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			const storeTimeout = 2 * time.Second
			rig := newEngineRig(t, idem.WithStoreTimeout(storeTimeout))
			req, scoped := rig.request()
			x := rig.begin(req)
			_, _ = x.Write([]byte(`{"id":"pay_1"}`))

			if mode == "reply-held" {
				rig.px.toxic("latency", "downstream", tpclient.Attributes{"latency": 3000}) // removed with the proxy
			} else {
				rig.px.toxic("timeout", "downstream", tpclient.Attributes{"timeout": 0}) // replies held until the cut
			}
			rig.redial.Store(true) // new connections are not affected
			done := make(chan struct{})
			go func() {
				defer close(done)
				x.Finish(http.StatusCreated, http.Header{"Content-Type": {"application/json"}})
			}()
			rig.waitState(scoped, "2") // the completion ran in Redis; its reply is held
			if mode == "connection-dropped" {
				rig.px.disable() // closes every connection through the proxy
			}
			within(t, done, 3*storeTimeout, "Finish")

			kinds := rig.kinds(scoped)
			if got := kinds[len(kinds)-1]; got != "completed" {
				t.Errorf("events %v: want the last to be completed", kinds)
			}
			for _, k := range kinds {
				if strings.HasPrefix(k, "lease-lost") {
					t.Errorf("events %v: a landed completion reported as a lost lease", kinds)
				}
			}
			if l := rig.logs(); strings.Contains(l, "lease lost") {
				t.Errorf("misleading log:\n%s", l)
			}
			if _, resp := rig.e.Begin(context.Background(), req); resp == nil || !resp.IsReplay() || string(resp.Body) != `{"id":"pay_1"}` {
				t.Errorf("retry: %+v, want the replay", resp)
			}
			t.Logf("%s: events %v", mode, kinds)
		})
	}
}

// TestRenewalFailuresLoggedOnce cuts the store off while a handler runs:
// every lease renewal fails and is reported as an event, but the log says
// so once for the execution, not once per attempt.
func TestRenewalFailuresLoggedOnce(t *testing.T) {
	t.Parallel()
	rig := newEngineRig(t, idem.WithLease(1200*time.Millisecond), idem.WithStoreTimeout(300*time.Millisecond))
	req, scoped := rig.request()
	x := rig.begin(req)
	rig.px.disable() // renewals every 400ms now fail
	failed := func() int {
		n := 0
		for _, k := range rig.kinds(scoped) {
			n += strings.Count(k, "store-error")
		}
		return n
	}
	for deadline := time.Now().Add(20 * time.Second); failed() < 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("events %v: want 3 failed renewals", rig.kinds(scoped))
		}
	}
	rig.px.enable()
	x.Fail()
	if n := strings.Count(rig.logs(), "lease renewal failed"); n != 1 {
		t.Errorf("%d failed renewals logged %d times, want once:\n%s", failed(), n, rig.logs())
	}
}
