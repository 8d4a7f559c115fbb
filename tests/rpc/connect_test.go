package rpc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/idemkit/idem/adapters/idemconnect"
	"github.com/idemkit/idem/adapters/idemgrpc"
	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// connectCreate is the Connect handler: the same headers and trailer as
// grpcCreate.
func (p *payments) connectCreate(ctx context.Context, r *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
	o := p.create(ctx, r.Msg)
	if o.code != 0 {
		ce := connect.NewError(connect.Code(o.code), errors.New(o.msg))
		if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.test"}); err == nil {
			ce.AddDetail(d)
		}
		ce.Meta().Set("X-Payment-Id", o.id)
		return nil, ce
	}
	res := connect.NewResponse(o.out)
	res.Header().Set("X-Payment-Id", o.id)
	res.Header().Set("Trace-Bin", connect.EncodeBinaryHeader([]byte("\x00\x01"+o.id)))
	res.Header().Set("X-Request-Id", rand.Text())
	res.Trailer().Set("X-Ledger", "L-"+o.id)
	return res, nil
}

// connectAuth stores the X-User header as the principal.
var connectAuth = connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
		if u := r.Header().Get("X-User"); u != "" {
			ctx = context.WithValue(ctx, principalKey{}, u)
		}
		return next(ctx, r)
	}
})

// startConnect serves payments over HTTP/2 with TLS (all three protocols)
// behind recovery, auth and idem (when e is not nil); mw wraps the handler
// when not nil.
func startConnect(t testing.TB, e *idem.Engine, mw func(http.Handler) http.Handler) (*httptest.Server, *payments) {
	return startConnectMW(t, e, mw, nil)
}

// startConnectWith is startConnect with outer, an interceptor between
// auth and idem.
func startConnectWith(t testing.TB, e *idem.Engine, outer connect.Interceptor) (*httptest.Server, *payments) {
	return startConnectMW(t, e, nil, outer)
}

func startConnectMW(t testing.TB, e *idem.Engine, mw func(http.Handler) http.Handler, outer connect.Interceptor) (*httptest.Server, *payments) {
	t.Helper()
	pay := newPayments()
	opts := []connect.HandlerOption{
		connect.WithRecover(func(_ context.Context, _ connect.Spec, _ http.Header, p any) error {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("panic: %v", p))
		}),
		connect.WithInterceptors(connectAuth),
	}
	if outer != nil {
		opts = append(opts, connect.WithInterceptors(outer))
	}
	if e != nil {
		opts = append(opts, connect.WithInterceptors(idemconnect.NewInterceptor(e, idemconnect.WithScope(userID), idemconnect.WithUnstoredHeaders("X-Request-Id"))))
	}
	var h http.Handler = connect.NewUnaryHandler(procedure, pay.connectCreate, opts...)
	if mw != nil {
		h = mw(h)
	}
	mux := http.NewServeMux()
	mux.Handle(procedure, h)
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() {
		pay.release()
		srv.Close()
	})
	return srv, pay
}

var protocols = []struct {
	name string
	opts []connect.ClientOption
}{
	{"connect", nil},
	{"connect+json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpcweb", []connect.ClientOption{connect.WithGRPCWeb()}},
}

func newConnectClient(srv *httptest.Server, opts ...connect.ClientOption) *connect.Client[structpb.Struct, structpb.Struct] {
	return connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+procedure, opts...)
}

// ccall is one Connect call's outcome.
type ccall struct {
	res *connect.Response[structpb.Struct]
	err error
}

func (c ccall) code() connect.Code { return connect.CodeOf(c.err) }

// meta returns the values of name in the response header and trailer, or
// in the error's metadata.
func (c ccall) meta(name string) []string {
	if c.err != nil {
		var ce *connect.Error
		if errors.As(c.err, &ce) {
			return ce.Meta().Values(name)
		}
		return nil
	}
	return append(c.res.Header().Values(name), c.res.Trailer().Values(name)...)
}

func connectCreate(ctx context.Context, cl *connect.Client[structpb.Struct, structpb.Struct], user, key string, in *structpb.Struct) ccall {
	r := connect.NewRequest(in)
	if user != "" {
		r.Header().Set("X-User", user)
	}
	if key != "" {
		r.Header().Set("Idempotency-Key", key)
	}
	res, err := cl.CallUnary(ctx, r)
	return ccall{res, err}
}

func cdetail[T proto.Message](err error) (T, bool) {
	var zero T
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return zero, false
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if m, ok := v.(T); ok {
				return m, true
			}
		}
	}
	return zero, false
}

func wantConnectCode(t *testing.T, c ccall, code connect.Code, reason string) {
	t.Helper()
	if c.code() != code {
		t.Fatalf("code = %v (%v), want %v", c.code(), c.err, code)
	}
	if reason == "" {
		return
	}
	if info, ok := cdetail[*errdetails.ErrorInfo](c.err); !ok || info.GetReason() != reason {
		t.Fatalf("ErrorInfo = %v, want reason %s", info, reason)
	}
}

func TestConnect(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			srv, pay := startConnect(t, newEngine(t, newStore(t, kind, ""), idemRetryAfter3s), nil)
			for _, p := range protocols {
				t.Run(p.name, func(t *testing.T) { testConnect(t, newConnectClient(srv, p.opts...), pay, p.name) })
			}
		})
	}
}

func testConnect(t *testing.T, cl *connect.Client[structpb.Struct, structpb.Struct], pay *payments, protoName string) {
	ctx := ctxT(t)
	tag := func(s string) string { return protoName + "/" + s }

	t.Run("fresh and replay", func(t *testing.T) {
		key := rand.Text()
		first := connectCreate(ctx, cl, "alice", key, req(1200, tag("a")))
		second := connectCreate(ctx, cl, "alice", key, req(1200, tag("a")))
		if first.err != nil || second.err != nil {
			t.Fatal(first.err, second.err)
		}
		if !proto.Equal(first.res.Msg, second.res.Msg) {
			t.Fatalf("replayed %v, want %v", second.res.Msg, first.res.Msg)
		}
		if first.res.Header().Get(idem.ReplayedHeader) != "" || second.res.Header().Get(idem.ReplayedHeader) != "true" {
			t.Fatalf("replay marker: first %v, second %v", first.res.Header(), second.res.Header())
		}
		for _, k := range []string{"X-Payment-Id", "Trace-Bin"} {
			if a, b := first.res.Header().Values(k), second.res.Header().Values(k); len(a) != 1 || len(b) != 1 || a[0] != b[0] {
				t.Errorf("header %s: first %q, replay %q", k, a, b)
			}
		}
		if got := second.res.Header().Get("X-Request-Id"); got != "" {
			t.Errorf("unstored X-Request-Id replayed: %q", got)
		}
		if a, b := first.res.Trailer().Get("X-Ledger"), second.res.Trailer().Get("X-Ledger"); a == "" || a != b {
			t.Errorf("trailer X-Ledger: first %q, replay %q", a, b)
		}
		if n := pay.calls(tag("a")); n != 1 {
			t.Fatalf("%d executions, want 1", n)
		}
		t.Run("mismatch", func(t *testing.T) {
			c := connectCreate(ctx, cl, "alice", key, req(1300, tag("a")))
			wantConnectCode(t, c, connect.CodeFailedPrecondition, "KEY_REUSED")
		})
	})
	t.Run("missing key", func(t *testing.T) {
		c := connectCreate(ctx, cl, "alice", "", req(1200, tag("m")))
		wantConnectCode(t, c, connect.CodeInvalidArgument, "KEY_MISSING")
		if br, ok := cdetail[*errdetails.BadRequest](c.err); !ok || br.GetFieldViolations()[0].GetField() != "Idempotency-Key" {
			t.Fatalf("BadRequest = %v", br)
		}
	})
	t.Run("malformed key", func(t *testing.T) {
		wantConnectCode(t, connectCreate(ctx, cl, "alice", strings.Repeat("k", 256), req(1200, tag("m"))), connect.CodeInvalidArgument, "KEY_MALFORMED")
	})
	t.Run("no principal", func(t *testing.T) {
		wantConnectCode(t, connectCreate(ctx, cl, "", rand.Text(), req(1200, tag("m"))), connect.CodeUnauthenticated, "NO_PRINCIPAL")
	})
	if n := pay.calls(tag("m")); n != 0 {
		t.Fatalf("refused calls executed %d times", n)
	}
	t.Run("declined stored", func(t *testing.T) {
		key := rand.Text()
		first := connectCreate(ctx, cl, "alice", key, req(amountDeclined, tag("d")))
		second := connectCreate(ctx, cl, "alice", key, req(amountDeclined, tag("d")))
		wantConnectCode(t, first, connect.CodeFailedPrecondition, "CARD_DECLINED")
		wantConnectCode(t, second, connect.CodeFailedPrecondition, "CARD_DECLINED")
		var a, b *connect.Error
		errors.As(first.err, &a)
		errors.As(second.err, &b)
		if a.Message() != b.Message() || len(second.meta(idem.ReplayedHeader)) == 0 {
			t.Fatalf("replayed error %v (meta %v), want %v", second.err, b.Meta(), first.err)
		}
		if x, y := first.meta("X-Payment-Id"), second.meta("X-Payment-Id"); len(x) != 1 || len(y) != 1 || x[0] != y[0] {
			t.Fatalf("X-Payment-Id: first %q, replay %q", x, y)
		}
		if n := pay.calls(tag("d")); n != 1 {
			t.Fatalf("%d executions, want 1", n)
		}
	})
	t.Run("unavailable released", func(t *testing.T) {
		key := rand.Text()
		for range 2 {
			wantConnectCode(t, connectCreate(ctx, cl, "alice", key, req(amountUnavailable, tag("u"))), connect.CodeUnavailable, "")
		}
		if n := pay.calls(tag("u")); n != 2 {
			t.Fatalf("%d executions, want 2", n)
		}
	})
	t.Run("panic released", func(t *testing.T) {
		key := rand.Text()
		for range 2 {
			c := connectCreate(ctx, cl, "alice", key, req(amountPanic, tag("p")))
			if c.code() != connect.CodeInternal || !strings.Contains(c.err.Error(), "boom") {
				t.Fatalf("panic answered %v", c.err)
			}
		}
		if n := pay.calls(tag("p")); n != 2 {
			t.Fatalf("%d executions, want 2", n)
		}
	})
	t.Run("in progress", func(t *testing.T) {
		key := rand.Text()
		done := make(chan ccall, 1)
		go func() { done <- connectCreate(ctx, cl, "alice", key, req(amountBlock, tag("b"))) }()
		<-pay.started
		c := connectCreate(ctx, cl, "alice", key, req(amountBlock, tag("b")))
		wantConnectCode(t, c, connect.CodeAborted, "IN_PROGRESS")
		if ri, ok := cdetail[*errdetails.RetryInfo](c.err); !ok || ri.GetRetryDelay().AsDuration() != 3*time.Second {
			t.Fatalf("RetryInfo = %v", ri)
		}
		if d, ok := idemconnect.RetryDelay(c.err); !ok || d != 3*time.Second {
			t.Fatalf("RetryDelay = %v %v", d, ok)
		}
		pay.release()
		if first := <-done; first.err != nil {
			t.Fatal(first.err)
		}
		if n := pay.calls(tag("b")); n != 1 {
			t.Fatalf("%d executions, want 1", n)
		}
	})
}

// TestConnectCrossProtocol: executed over the Connect protocol with JSON,
// replayed over gRPC and gRPC-Web with binary protobuf.
func TestConnectCrossProtocol(t *testing.T) {
	ctx := ctxT(t)
	srv, pay := startConnect(t, newEngine(t, newStore(t, "memory", "")), nil)
	key := rand.Text()
	first := connectCreate(ctx, newConnectClient(srv, connect.WithProtoJSON()), "alice", key, req(1200, "x"))
	if first.err != nil {
		t.Fatal(first.err)
	}
	for _, o := range []connect.ClientOption{connect.WithGRPC(), connect.WithGRPCWeb()} {
		c := connectCreate(ctx, newConnectClient(srv, o), "alice", key, req(1200, "x"))
		if c.err != nil || !proto.Equal(c.res.Msg, first.res.Msg) || c.res.Header().Get(idem.ReplayedHeader) != "true" {
			t.Fatalf("replay: %v %v %v", c.err, c.res, first.res.Msg)
		}
	}
	if n := pay.total.Load(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}

// TestCrossDoor: one engine behind a grpc-go server and a connect-go
// handler: a call executed through one door is replayed through the other.
func TestCrossDoor(t *testing.T) {
	ctx := ctxT(t)
	e := newEngine(t, newStore(t, "redis", ""))
	gs := startGRPC(t, e, nil)
	cs, cpay := startConnect(t, e, nil)
	cc := dial(t, gs.addr)
	cl := newConnectClient(cs, connect.WithGRPC())

	key := rand.Text()
	g := create(ctx, cc, "alice", key, req(1200, "g"))
	c := connectCreate(ctx, cl, "alice", key, req(1200, "g"))
	if g.err != nil || c.err != nil || !proto.Equal(g.out, c.res.Msg) || c.res.Header().Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("grpc → connect: %v %v", g.err, c.err)
	}
	if a, b := g.header.Get("x-payment-id"), c.res.Header().Get("X-Payment-Id"); len(a) != 1 || a[0] != b {
		t.Fatalf("x-payment-id %q vs %q", a, b)
	}
	key = rand.Text()
	c = connectCreate(ctx, cl, "alice", key, req(1300, "c"))
	g = create(ctx, cc, "alice", key, req(1300, "c"))
	if g.err != nil || c.err != nil || !proto.Equal(g.out, c.res.Msg) || g.header.Get(idemgrpc.ReplayedMetadata) == nil {
		t.Fatalf("connect → grpc: %v %v", g.err, c.err)
	}
	if gs.pay.total.Load()+cpay.total.Load() != 2 {
		t.Fatalf("%d + %d executions, want 2", gs.pay.total.Load(), cpay.total.Load())
	}
}

// TestConnectIdemhttp shows what idemhttp alone does around a Connect
// handler: the Connect protocol's unary calls are protected and replayed,
// but idem's own answers reach Connect clients only as HTTP statuses (a
// missing key becomes CodeInternal, with no details), and gRPC's HTTP 200
// with the status in trailers makes it store errors as successes. Hence
// idemconnect.
func TestConnectIdemhttp(t *testing.T) {
	ctx := ctxT(t)
	e := newEngine(t, newStore(t, "memory", ""))
	srv, pay := startConnect(t, nil, func(h http.Handler) http.Handler {
		return idemhttp.New(e, idemhttp.WithScope(func(r *http.Request) string { return r.Header.Get("X-User") }))(h)
	})
	cl := newConnectClient(srv)
	key := rand.Text()
	// One field: idemhttp fingerprints the bytes on the wire, and protobuf
	// encodes a Struct's fields (a map) in random order, so a two-field
	// message may differ between honest retries and get 422 there.
	one, _ := structpb.NewStruct(map[string]any{"amount": 1200})
	first := connectCreate(ctx, cl, "alice", key, one)
	second := connectCreate(ctx, cl, "alice", key, one)
	if first.err != nil || second.err != nil || !proto.Equal(first.res.Msg, second.res.Msg) || second.res.Header().Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("Connect protocol through idemhttp: %v %v", first.err, second.err)
	}
	if n := pay.total.Load(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
	if c := connectCreate(ctx, cl, "alice", "", one); c.code() != connect.CodeInternal {
		t.Fatalf("missing key through idemhttp: %v, want CodeInternal (HTTP 400 as Connect reads it)", c.err)
	}
	// gRPC protocol: an Unavailable answer is HTTP 200 with grpc-status in
	// the trailers (or in the header of a trailers-only response), so
	// idemhttp stores it instead of releasing the key: the retry does not
	// execute again (what the client sees of the replay varies).
	g := newConnectClient(srv, connect.WithGRPC())
	key = rand.Text()
	unavailable, _ := structpb.NewStruct(map[string]any{"amount": amountUnavailable})
	if c := connectCreate(ctx, g, "alice", key, unavailable); c.code() != connect.CodeUnavailable {
		t.Fatalf("first: %v", c.err)
	}
	_ = connectCreate(ctx, g, "alice", key, unavailable)
	if n := pay.total.Load(); n != 2 {
		t.Fatalf("idemhttp on gRPC: %d executions in all, want 2 (1 + 1 unavailable); expected the Unavailable to be stored as a 200 (the reason for idemconnect)", n)
	}
}

// TestConnectResponseNotStored: a response over the stored limit is sent
// once; retries get FailedPrecondition RESPONSE_NOT_STORED, on every protocol.
func TestConnectResponseNotStored(t *testing.T) {
	ctx := ctxT(t)
	srv, pay := startConnect(t, newEngine(t, newStore(t, "memory", ""), idem.WithMaxResponseBytes(16)), nil)
	key := rand.Text()
	if c := connectCreate(ctx, newConnectClient(srv), "alice", key, req(1200, "big")); c.err != nil {
		t.Fatal(c.err)
	}
	for _, p := range protocols {
		wantConnectCode(t, connectCreate(ctx, newConnectClient(srv, p.opts...), "alice", key, req(1200, "big")), connect.CodeFailedPrecondition, "RESPONSE_NOT_STORED")
	}
	if n := pay.total.Load(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}
