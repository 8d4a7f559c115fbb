package rpc

import (
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	tpclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/idemkit/idem/adapters/idemconnect"
	"github.com/idemkit/idem/adapters/idemgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// attempts counts, per logical call (the "call" field), the attempts that
// reached the server and the keys they carried.
type attempts struct {
	mu   sync.Mutex
	keys map[string][]string
}

func (a *attempts) add(call, key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.keys == nil {
		a.keys = map[string][]string{}
	}
	a.keys[call] = append(a.keys[call], key)
	return len(a.keys[call])
}

func (a *attempts) of(call string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.keys[call]...)
}

// callOf is the "call" field of a payments request.
func callOf(r any) string {
	s, _ := r.(*structpb.Struct)
	return s.GetFields()["call"].GetStringValue()
}

// TestGRPCClientKeepsKeyAcrossGRPCRetries: gRPC's own retry policy (service
// config) re-sends the call after Unavailable beneath the interceptor; every
// attempt carries the interceptor's one key, and the payment executes once.
func TestGRPCClientKeepsKeyAcrossGRPCRetries(t *testing.T) {
	ctx := ctxT(t)
	var seen attempts
	failFirst2 := func(ctx context.Context, r any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if seen.add(callOf(r), firstOf(md.Get("idempotency-key"))) <= 2 {
			return nil, status.Error(codes.Unavailable, "injected: not executed")
		}
		return h(ctx, r)
	}
	s := startGRPC(t, newEngine(t, newStore(t, "memory", "")), []grpc.UnaryServerInterceptor{failFirst2})
	cc := dial(t, s.addr, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithAttempts(1))),
		grpc.WithDefaultServiceConfig(`{"methodConfig":[{"name":[{"service":"`+service+`"}],"retryPolicy":{"maxAttempts":4,"initialBackoff":"0.01s","maxBackoff":"0.05s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`))
	for i := range 3 {
		call := fmt.Sprint("r", i)
		out := new(structpb.Struct)
		if err := cc.Invoke(metadata.AppendToOutgoingContext(ctx, "x-user", "alice"), procedure, req(1200, call), out); err != nil {
			t.Fatal(err)
		}
		keys := seen.of(call)
		if len(keys) != 3 || keys[0] == "" || keys[0] != keys[1] || keys[1] != keys[2] {
			t.Fatalf("call %s: keys per attempt %q, want one key on 3 attempts", call, keys)
		}
		if n := s.pay.calls(call); n != 1 {
			t.Fatalf("call %s: %d executions", call, n)
		}
	}
}

func firstOf(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// TestGRPCClientRetriesInProgress: the interceptor keeps a key the caller
// set, and retries idem's Aborted-with-RetryInfo until the first execution
// completes, then gets its replay.
func TestGRPCClientRetriesInProgress(t *testing.T) {
	ctx := ctxT(t)
	var seen attempts
	var aborted atomic.Int64
	count := func(ctx context.Context, r any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		seen.add(callOf(r), firstOf(md.Get("idempotency-key")))
		out, err := h(ctx, r)
		if status.Code(err) == codes.Aborted {
			aborted.Add(1)
		}
		return out, err
	}
	s := startGRPC(t, newEngine(t, newStore(t, "memory", "")), []grpc.UnaryServerInterceptor{count})
	plain := dial(t, s.addr)
	retrying := dial(t, s.addr, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	key := rand.Text()
	done := make(chan call, 1)
	go func() { done <- create(ctx, plain, "alice", key, req(amountBlock, "b")) }()
	<-s.pay.started
	second := make(chan call, 1)
	go func() { second <- create(ctx, retrying, "alice", key, req(amountBlock, "b")) }()
	for aborted.Load() == 0 { // until the retrying call's first attempt got Aborted
		time.Sleep(5 * time.Millisecond)
	}
	s.pay.release()
	if c := <-done; c.err != nil {
		t.Fatal(c.err)
	}
	c := <-second
	if c.err != nil || c.header.Get(idemgrpc.ReplayedMetadata) == nil {
		t.Fatalf("retried call: %v, header %v", c.err, c.header)
	}
	if keys := seen.of("b"); len(keys) < 3 || keys[len(keys)-1] != key {
		t.Fatalf("attempts' keys %q, want the caller's key %q on 3 or more", keys, key)
	}
	if n := s.pay.total.Load(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}

// loseAnswers is a server interceptor outside idem that, on the first
// attempt of every third logical call, lets the call execute and then
// replaces its answer with Unavailable: the answer lost after the work was
// done, the case where a retry without a key executes twice.
func loseAnswers(lost *atomic.Int64) grpc.UnaryServerInterceptor {
	var seen attempts
	return func(ctx context.Context, r any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		n := seen.add(callOf(r), firstOf(md.Get("idempotency-key")))
		out, err := h(ctx, r)
		if n == 1 && err == nil && callIndex(r)%3 == 0 {
			lost.Add(1)
			return nil, status.Error(codes.Unavailable, "injected: answer lost")
		}
		return out, err
	}
}

func callIndex(r any) int {
	var i int
	_, _ = fmt.Sscanf(callOf(r), "c%d", &i)
	return i
}

// chaos toggles a reset_peer toxic (connections reset after 0–40ms) on px
// until stop is closed; it returns the number of toxics added.
func chaos(t *testing.T, px *tpclient.Proxy, stop <-chan struct{}) <-chan int {
	out := make(chan int, 1)
	go func() {
		n := 0
		defer func() { out <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(20+mrand.IntN(40)) * time.Millisecond):
			}
			if _, err := px.AddToxic("reset", "reset_peer", "downstream", 1, tpclient.Attributes{"timeout": mrand.IntN(40)}); err != nil {
				t.Errorf("add toxic: %v", err)
				return
			}
			n++
			select {
			case <-stop:
			case <-time.After(time.Duration(10+mrand.IntN(30)) * time.Millisecond):
			}
			if err := px.RemoveToxic("reset"); err != nil {
				t.Errorf("remove toxic: %v", err)
				return
			}
		}
	}()
	return out
}

const logicalCalls = 30

// runCalls runs logicalCalls calls c0..c29 on 5 workers with do; every one
// must succeed.
func runCalls(t *testing.T, do func(call string) error) {
	var wg sync.WaitGroup
	calls := make(chan string)
	for range 5 {
		wg.Go(func() {
			for c := range calls {
				if err := do(c); err != nil {
					t.Errorf("logical call %s failed: %v", c, err)
				}
			}
		})
	}
	for i := range logicalCalls {
		calls <- fmt.Sprint("c", i)
	}
	close(calls)
	wg.Wait()
}

// TestGRPCClientThroughFaultyProxy: N logical calls through toxiproxy
// resetting connections, with answers lost after execution: every call
// succeeds and each executes exactly once.
func TestGRPCClientThroughFaultyProxy(t *testing.T) {
	ctx := ctxT(t)
	var lost atomic.Int64
	s := startGRPC(t, newEngine(t, newStore(t, "redis", "")), []grpc.UnaryServerInterceptor{loseAnswers(&lost)})
	px := newProxy(t, s.addr)
	cc := dial(t, px.Listen,
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithAttempts(40), idemgrpc.WithBackoff(10*time.Millisecond, 100*time.Millisecond))),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}, MinConnectTimeout: 5 * time.Second}))
	stop := make(chan struct{})
	toxics := chaos(t, px, stop)
	runCalls(t, func(c string) error {
		out := new(structpb.Struct)
		return cc.Invoke(metadata.AppendToOutgoingContext(ctx, "x-user", "alice"), procedure, req(1200, c), out)
	})
	close(stop)
	t.Logf("%d reset toxics, %d answers lost after execution", <-toxics, lost.Load())
	checkOnce(t, s.pay, lost.Load())
}

func checkOnce(t *testing.T, pay *payments, lost int64) {
	t.Helper()
	if lost == 0 {
		t.Fatal("no answer was lost after execution: the test proves nothing")
	}
	for i := range logicalCalls {
		if n := pay.calls(fmt.Sprint("c", i)); n != 1 {
			t.Errorf("logical call c%d executed %d times", i, n)
		}
	}
}

// loseConnectAnswers is loseAnswers for a Connect handler.
func loseConnectAnswers(lost *atomic.Int64) connect.Interceptor {
	var seen attempts
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			n := seen.add(callOf(r.Any()), r.Header().Get("Idempotency-Key"))
			res, err := next(ctx, r)
			if n == 1 && err == nil && callIndex(r.Any())%3 == 0 {
				lost.Add(1)
				return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("injected: answer lost"))
			}
			return res, err
		}
	})
}

// TestConnectClientThroughFaultyProxy is TestGRPCClientThroughFaultyProxy
// for connect-go on each protocol.
func TestConnectClientThroughFaultyProxy(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			ctx := ctxT(t)
			var lost atomic.Int64
			e := newEngine(t, newStore(t, "redis", ""))
			srv, pay := startConnectWith(t, e, loseConnectAnswers(&lost))
			px := newProxy(t, srv.Listener.Addr().String())
			hc := srv.Client()
			hc.Transport.(*http.Transport).DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, px.Listen)
			}
			cl := connect.NewClient[structpb.Struct, structpb.Struct](hc, srv.URL+procedure, append(p.opts,
				connect.WithInterceptors(idemconnect.NewClientInterceptor(idemconnect.WithAttempts(40), idemconnect.WithBackoff(10*time.Millisecond, 100*time.Millisecond))))...)
			stop := make(chan struct{})
			toxics := chaos(t, px, stop)
			runCalls(t, func(c string) error {
				r := connect.NewRequest(req(1200, c))
				r.Header().Set("X-User", "alice")
				_, err := cl.CallUnary(ctx, r)
				return err
			})
			close(stop)
			t.Logf("%d reset toxics, %d answers lost after execution", <-toxics, lost.Load())
			checkOnce(t, pay, lost.Load())
		})
	}
}
