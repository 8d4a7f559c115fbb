package rpc

import (
	"context"
	"crypto/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/adapters/idemgrpc"
	idem "github.com/idemkit/idem/core"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// call is one unary call's outcome as the client saw it.
type call struct {
	out             *structpb.Struct
	header, trailer metadata.MD
	err             error
}

// create calls Create on cc as user with key ("" : none).
func create(ctx context.Context, cc *grpc.ClientConn, user, key string, in *structpb.Struct, opts ...grpc.CallOption) call {
	var pairs []string
	if user != "" {
		pairs = append(pairs, "x-user", user)
	}
	if key != "" {
		pairs = append(pairs, "idempotency-key", key)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, pairs...)
	var c call
	c.out = new(structpb.Struct)
	c.err = cc.Invoke(ctx, procedure, in, c.out, append(opts, grpc.Header(&c.header), grpc.Trailer(&c.trailer))...)
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // hang guard
	t.Cleanup(cancel)
	return ctx
}

// detail returns the first detail of err of type T.
func detail[T proto.Message](err error) (T, bool) {
	var zero T
	for _, d := range status.Convert(err).Details() {
		if v, ok := d.(T); ok {
			return v, true
		}
	}
	return zero, false
}

func wantCode(t *testing.T, c call, code codes.Code, reason string) {
	t.Helper()
	if got := status.Code(c.err); got != code {
		t.Fatalf("code = %v (%v), want %v", got, c.err, code)
	}
	if reason == "" {
		return
	}
	info, ok := detail[*errdetails.ErrorInfo](c.err)
	if !ok || info.GetReason() != reason || info.GetDomain() != idemgrpc.ErrorDomain {
		t.Fatalf("ErrorInfo = %v, want reason %s in %s", info, reason, idemgrpc.ErrorDomain)
	}
}

func TestGRPC(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Run("fresh and replay", func(t *testing.T) { testGRPCReplay(t, kind) })
			t.Run("errors", func(t *testing.T) { testGRPCErrors(t, kind) })
			t.Run("policy", func(t *testing.T) { testGRPCPolicy(t, kind) })
			t.Run("in progress", func(t *testing.T) { testGRPCInProgress(t, kind) })
			t.Run("40 duplicates", func(t *testing.T) { testGRPCDuplicates(t, kind) })
		})
	}
}

func testGRPCReplay(t *testing.T, kind string) {
	ctx := ctxT(t)
	s := startGRPC(t, newEngine(t, newStore(t, kind, "")), nil)
	cc := dial(t, s.addr)
	key := rand.Text()
	first := create(ctx, cc, "alice", key, req(1200, "a"))
	if first.err != nil {
		t.Fatal(first.err)
	}
	if first.header.Get(idemgrpc.ReplayedMetadata) != nil {
		t.Fatalf("first call marked replayed: %v", first.header)
	}
	second := create(ctx, cc, "alice", key, req(1200, "a"))
	if second.err != nil {
		t.Fatal(second.err)
	}
	if !proto.Equal(first.out, second.out) {
		t.Fatalf("replayed message %v, want %v", second.out, first.out)
	}
	if got := second.header.Get(idemgrpc.ReplayedMetadata); len(got) != 1 || got[0] != "true" {
		t.Fatalf("replay header %v lacks %s: true", second.header, idemgrpc.ReplayedMetadata)
	}
	for _, k := range []string{"x-payment-id", "trace-bin"} {
		if a, b := first.header.Get(k), second.header.Get(k); len(a) != 1 || strings.Join(a, ",") != strings.Join(b, ",") {
			t.Errorf("header %s: first %q, replay %q", k, a, b)
		}
	}
	if got := second.header.Get("x-request-id"); got != nil {
		t.Errorf("unstored x-request-id replayed: %q", got)
	}
	if a, b := first.trailer.Get("x-ledger"), second.trailer.Get("x-ledger"); len(a) != 1 || a[0] != b[0] {
		t.Errorf("trailer x-ledger: first %q, replay %q", a, b)
	}
	if n, info := s.pay.total.Load(), s.pay.withInfo.Load(); n != 1 || info != 1 {
		t.Fatalf("%d executions (%d with idem.Info), want 1", n, info)
	}
	// Another principal with the same key is another record.
	if c := create(ctx, cc, "bob", key, req(1200, "a")); c.err != nil || c.header.Get(idemgrpc.ReplayedMetadata) != nil {
		t.Fatalf("bob's call: %v, header %v", c.err, c.header)
	}
	if n := s.pay.total.Load(); n != 2 {
		t.Fatalf("%d executions, want 2", n)
	}
}

func testGRPCErrors(t *testing.T, kind string) {
	ctx := ctxT(t)
	s := startGRPC(t, newEngine(t, newStore(t, kind, "")), nil)
	cc := dial(t, s.addr)
	key := rand.Text()
	if c := create(ctx, cc, "alice", key, req(1200, "a")); c.err != nil {
		t.Fatal(c.err)
	}

	t.Run("mismatch", func(t *testing.T) {
		c := create(ctx, cc, "alice", key, req(1300, "a"))
		wantCode(t, c, codes.FailedPrecondition, "KEY_REUSED")
		if pf, ok := detail[*errdetails.PreconditionFailure](c.err); !ok || pf.GetViolations()[0].GetType() != "IDEMPOTENCY_KEY" {
			t.Fatalf("PreconditionFailure = %v", pf)
		}
	})
	t.Run("missing key", func(t *testing.T) {
		c := create(ctx, cc, "alice", "", req(1200, "a"))
		wantCode(t, c, codes.InvalidArgument, "KEY_MISSING")
		if br, ok := detail[*errdetails.BadRequest](c.err); !ok || br.GetFieldViolations()[0].GetField() != "idempotency-key" {
			t.Fatalf("BadRequest = %v", br)
		}
	})
	t.Run("malformed key", func(t *testing.T) {
		for _, k := range []string{strings.Repeat("k", 256), `"k";a=1`} {
			wantCode(t, create(ctx, cc, "alice", k, req(1200, "a")), codes.InvalidArgument, "KEY_MALFORMED")
		}
		ctx := metadata.AppendToOutgoingContext(ctx, "idempotency-key", "k1", "idempotency-key", "k2")
		wantCode(t, create(ctx, cc, "alice", "", req(1200, "a")), codes.InvalidArgument, "KEY_MALFORMED")
	})
	t.Run("no principal", func(t *testing.T) {
		wantCode(t, create(ctx, cc, "", rand.Text(), req(1200, "a")), codes.Unauthenticated, "NO_PRINCIPAL")
	})
	if n := s.pay.total.Load(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}

func testGRPCPolicy(t *testing.T, kind string) {
	ctx := ctxT(t)
	s := startGRPC(t, newEngine(t, newStore(t, kind, "")), nil)
	cc := dial(t, s.addr)

	// Declined: a deterministic client error, stored and replayed with its
	// message, details and metadata.
	key := rand.Text()
	first := create(ctx, cc, "alice", key, req(amountDeclined, "d"))
	second := create(ctx, cc, "alice", key, req(amountDeclined, "d"))
	wantCode(t, first, codes.FailedPrecondition, "")
	if !proto.Equal(status.Convert(first.err).Proto(), status.Convert(second.err).Proto()) {
		t.Fatalf("replayed error %v, want %v", second.err, first.err)
	}
	if _, ok := detail[*errdetails.ErrorInfo](second.err); !ok {
		t.Fatal("replayed error lost its details")
	}
	if got := append(second.header.Get(idemgrpc.ReplayedMetadata), second.trailer.Get(idemgrpc.ReplayedMetadata)...); len(got) == 0 {
		t.Fatalf("replayed error not marked: header %v trailer %v", second.header, second.trailer)
	}
	if a, b := append(first.header.Get("x-payment-id"), first.trailer.Get("x-payment-id")...), append(second.header.Get("x-payment-id"), second.trailer.Get("x-payment-id")...); len(a) != 1 || len(b) != 1 || a[0] != b[0] {
		t.Fatalf("x-payment-id: first %q, replay %q", a, b)
	}
	if n := s.pay.calls("d"); n != 1 {
		t.Fatalf("declined: %d executions, want 1", n)
	}

	// Unavailable: released, the retry executes again.
	key = rand.Text()
	for range 2 {
		wantCode(t, create(ctx, cc, "alice", key, req(amountUnavailable, "u")), codes.Unavailable, "")
	}
	if n := s.pay.calls("u"); n != 2 {
		t.Fatalf("unavailable: %d executions, want 2 (released)", n)
	}

	// Panic, recovered outside idem: released.
	key = rand.Text()
	for range 2 {
		c := create(ctx, cc, "alice", key, req(amountPanic, "p"))
		if status.Code(c.err) != codes.Internal || !strings.Contains(status.Convert(c.err).Message(), "boom") {
			t.Fatalf("panic answered %v, want the recovery's Internal", c.err)
		}
	}
	if n := s.pay.calls("p"); n != 2 {
		t.Fatalf("panic: %d executions, want 2 (released)", n)
	}
}

func testGRPCInProgress(t *testing.T, kind string) {
	ctx := ctxT(t)
	s := startGRPC(t, newEngine(t, newStore(t, kind, ""), idemRetryAfter3s), nil)
	cc := dial(t, s.addr)
	key := rand.Text()
	done := make(chan call, 1)
	go func() { done <- create(ctx, cc, "alice", key, req(amountBlock, "b")) }()
	<-s.pay.started
	c := create(ctx, cc, "alice", key, req(amountBlock, "b"))
	wantCode(t, c, codes.Aborted, "IN_PROGRESS")
	ri, ok := detail[*errdetails.RetryInfo](c.err)
	if !ok || ri.GetRetryDelay().AsDuration() != 3*time.Second {
		t.Fatalf("RetryInfo = %v, want 3s", ri)
	}
	if d, ok := idemgrpc.RetryDelay(c.err); !ok || d != 3*time.Second {
		t.Fatalf("RetryDelay = %v, %v", d, ok)
	}
	s.pay.release()
	if first := <-done; first.err != nil {
		t.Fatal(first.err)
	}
	if c := create(ctx, cc, "alice", key, req(amountBlock, "b")); c.err != nil || c.header.Get(idemgrpc.ReplayedMetadata) == nil {
		t.Fatalf("after completion: %v %v", c.err, c.header)
	}
	if n := s.pay.total.Load(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}

// testGRPCDuplicates sends 40 concurrent calls with one key while the first
// execution is held: one executes, 39 get Aborted with RetryInfo; the next
// call gets the replay. A call answered Unavailable STORE_UNAVAILABLE (the
// store did not answer within the engine's 500ms: a loaded machine) is
// retried after its RetryInfo delay, as a client would, for up to a
// minute.
func testGRPCDuplicates(t *testing.T, kind string) {
	ctx := ctxT(t)
	s := startGRPC(t, newEngine(t, newStore(t, kind, "")), nil)
	cc := dial(t, s.addr)
	key := rand.Text()
	const n = 40
	results := make(chan call, n)
	var wg sync.WaitGroup
	var unavailable atomic.Int64
	for range n {
		wg.Go(func() {
			c := create(ctx, cc, "alice", key, req(amountBlock, "x"))
			for deadline := time.Now().Add(time.Minute); status.Code(c.err) == codes.Unavailable; {
				info, _ := detail[*errdetails.ErrorInfo](c.err)
				retry, ok := detail[*errdetails.RetryInfo](c.err)
				if info.GetReason() != "STORE_UNAVAILABLE" || !ok || time.Now().Add(retry.GetRetryDelay().AsDuration()).After(deadline) {
					break
				}
				unavailable.Add(1)
				time.Sleep(retry.GetRetryDelay().AsDuration())
				c = create(ctx, cc, "alice", key, req(amountBlock, "x"))
			}
			results <- c
		})
	}
	aborted := 0
	for aborted < n-1 { // the held execution answers only after the gate opens
		c := <-results
		wantCode(t, c, codes.Aborted, "IN_PROGRESS")
		if _, ok := detail[*errdetails.RetryInfo](c.err); !ok {
			t.Fatal("Aborted without RetryInfo")
		}
		aborted++
	}
	s.pay.release()
	wg.Wait()
	if c := <-results; c.err != nil {
		t.Fatal(c.err)
	}
	if c := create(ctx, cc, "alice", key, req(amountBlock, "x")); c.err != nil || c.header.Get(idemgrpc.ReplayedMetadata) == nil {
		t.Fatalf("after completion: %v", c.err)
	}
	if got := s.pay.total.Load(); got != 1 {
		t.Fatalf("%d executions, want 1", got)
	}
	if u := unavailable.Load(); u > 0 {
		t.Logf("%d calls answered Unavailable STORE_UNAVAILABLE were retried", u)
	}
}

// TestGRPCStoreDown puts toxiproxy between the engine and Redis: with the
// proxy down, calls get Unavailable with RetryInfo and nothing executes;
// with it back, the same key executes once.
func TestGRPCStoreDown(t *testing.T) {
	ctx := ctxT(t)
	px := newProxy(t, redisOptions(t).Addr)
	s := startGRPC(t, newEngine(t, newStore(t, "redis", px.Listen)), nil)
	cc := dial(t, s.addr)
	key := rand.Text()
	if err := px.Disable(); err != nil {
		t.Fatal(err)
	}
	c := create(ctx, cc, "alice", key, req(1200, "s"))
	wantCode(t, c, codes.Unavailable, "STORE_UNAVAILABLE")
	if _, ok := detail[*errdetails.RetryInfo](c.err); !ok {
		t.Fatal("Unavailable without RetryInfo")
	}
	if n := s.pay.total.Load(); n != 0 {
		t.Fatalf("%d executions with the store down, want 0", n)
	}
	if err := px.Enable(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if c := create(ctx, cc, "alice", key, req(1200, "s")); c.err != nil {
			t.Fatal(c.err)
		}
	}
	if n := s.pay.total.Load(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}

// TestGRPCStreamingPassesThrough: a streaming method is not intercepted
// (a unary interceptor never sees it): no key needed.
func TestGRPCSkip(t *testing.T) {
	ctx := ctxT(t)
	s := startGRPC(t, newEngine(t, newStore(t, "memory", "")), nil, idemgrpc.WithSkip(func(m string) bool { return m == procedure }))
	cc := dial(t, s.addr)
	for range 2 {
		if c := create(ctx, cc, "alice", "", req(1200, "k")); c.err != nil {
			t.Fatal(c.err)
		}
	}
	if n := s.pay.total.Load(); n != 2 {
		t.Fatalf("%d executions, want 2", n)
	}
}

// TestGRPCEngineAnswers covers the engine's other answers: a request
// message over the body limit (ResourceExhausted), a response over the
// stored limit (executed once, then FailedPrecondition with its original
// status), and an app's problem renderer (the gRPC answers don't depend on
// the problem's body).
func TestGRPCEngineAnswers(t *testing.T) {
	ctx := ctxT(t)
	t.Run("body too large", func(t *testing.T) {
		s := startGRPC(t, newEngine(t, newStore(t, "memory", ""), idem.WithMaxBodyBytes(8)), nil)
		cc := dial(t, s.addr)
		wantCode(t, create(ctx, cc, "alice", rand.Text(), req(1200, strings.Repeat("x", 64))), codes.ResourceExhausted, "BODY_TOO_LARGE")
		if n := s.pay.total.Load(); n != 0 {
			t.Fatalf("%d executions, want 0", n)
		}
	})
	t.Run("response not stored", func(t *testing.T) {
		s := startGRPC(t, newEngine(t, newStore(t, "memory", ""), idem.WithMaxResponseBytes(16)), nil)
		cc := dial(t, s.addr)
		key := rand.Text()
		if c := create(ctx, cc, "alice", key, req(1200, "big")); c.err != nil {
			t.Fatal(c.err)
		}
		c := create(ctx, cc, "alice", key, req(1200, "big"))
		wantCode(t, c, codes.FailedPrecondition, "RESPONSE_NOT_STORED")
		if info, _ := detail[*errdetails.ErrorInfo](c.err); info.GetMetadata()["original_status"] != "200" {
			t.Fatalf("ErrorInfo metadata %v, want original_status 200", info.GetMetadata())
		}
		if n := s.pay.total.Load(); n != 1 {
			t.Fatalf("%d executions, want 1", n)
		}
	})
	t.Run("problem renderer", func(t *testing.T) {
		e := newEngine(t, newStore(t, "memory", ""), idem.WithProblemRenderer(func(p idem.Problem) (string, []byte) {
			return "text/plain", []byte(p.Title)
		}))
		s := startGRPC(t, e, nil)
		cc := dial(t, s.addr)
		wantCode(t, create(ctx, cc, "alice", "", req(1200, "r")), codes.InvalidArgument, "KEY_MISSING")
		wantCode(t, create(ctx, cc, "", rand.Text(), req(1200, "r")), codes.Unauthenticated, "NO_PRINCIPAL")
	})
}
