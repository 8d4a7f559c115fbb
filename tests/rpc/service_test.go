package rpc

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/adapters/idemgrpc"
	idem "github.com/idemkit/idem/core"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// The payments contract of the examples, on a structpb.Struct request
// {"amount": n, "call": "..."}: 4000 is declined (FailedPrecondition, a
// deterministic client error: stored), 5000 finds the bank unavailable
// (Unavailable: released), 6000 panics, 7000 blocks until the test opens
// the gate; anything else creates a payment {"id": "pay_N", "amount": n}.
const (
	amountDeclined    = 4000
	amountUnavailable = 5000
	amountPanic       = 6000
	amountBlock       = 7000
)

const (
	service   = "test.v1.Payments"
	procedure = "/" + service + "/Create"
)

// payments counts its executions, per "call" field and in total.
type payments struct {
	total    atomic.Int64
	withInfo atomic.Int64 // executions whose context carried idem.Info
	mu       sync.Mutex
	byCall   map[string]int
	started  chan struct{} // one value per blocking execution started
	gate     chan struct{} // closed: blocking executions end
}

func newPayments() *payments {
	return &payments{byCall: map[string]int{}, started: make(chan struct{}, 64), gate: make(chan struct{})}
}

// outcome is what create decided: a payment, or an error code and message.
type outcome struct {
	out  *structpb.Struct
	id   string
	code codes.Code
	msg  string
}

func (p *payments) create(ctx context.Context, in *structpb.Struct) outcome {
	n := p.total.Add(1)
	call := in.GetFields()["call"].GetStringValue()
	p.mu.Lock()
	p.byCall[call]++
	p.mu.Unlock()
	if _, ok := idem.InfoFromContext(ctx); ok {
		p.withInfo.Add(1)
	}
	id := fmt.Sprintf("pay_%d", n)
	switch amount := in.GetFields()["amount"].GetNumberValue(); amount {
	case amountDeclined:
		return outcome{id: id, code: codes.FailedPrecondition, msg: "card declined"}
	case amountUnavailable:
		return outcome{id: id, code: codes.Unavailable, msg: "bank unavailable"}
	case amountPanic:
		panic("payments: boom")
	case amountBlock:
		p.mu.Lock()
		gate := p.gate
		p.mu.Unlock()
		p.started <- struct{}{}
		<-gate
	}
	out, _ := structpb.NewStruct(map[string]any{"id": id, "amount": in.GetFields()["amount"].GetNumberValue()})
	return outcome{out: out, id: id}
}

func (p *payments) calls(call string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byCall[call]
}

// grpcCreate is the gRPC method: it sets header metadata x-payment-id,
// trace-bin (binary) and x-request-id (per exchange: unstored), and the
// trailer x-ledger.
func (p *payments) grpcCreate(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	o := p.create(ctx, in)
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-payment-id", o.id, "trace-bin", "\x00\x01"+o.id, "x-request-id", rand.Text()))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ledger", "L-"+o.id))
	if o.code != codes.OK {
		st, _ := status.New(o.code, o.msg).WithDetails(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.test"})
		return nil, st.Err()
	}
	return o.out, nil
}

var paymentsDesc = grpc.ServiceDesc{
	ServiceName: service,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(structpb.Struct)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, req any) (any, error) {
			return srv.(*payments).grpcCreate(ctx, req.(*structpb.Struct))
		}
		if icpt == nil {
			return h(ctx, in)
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: procedure}, h)
	}}},
}

type principalKey struct{}

// userID is the scope function: the principal auth stored.
func userID(ctx context.Context) string { s, _ := ctx.Value(principalKey{}).(string); return s }

// grpcAuth stores the x-user metadata as the principal.
func grpcAuth(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if u := md.Get("x-user"); len(u) > 0 {
		ctx = context.WithValue(ctx, principalKey{}, u[0])
	}
	return h(ctx, req)
}

// grpcRecovery answers a panic with Internal, as go-grpc-middleware's recovery does.
func grpcRecovery(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			resp, err = nil, status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return h(ctx, req)
}

// grpcServer is a payments gRPC server on 127.0.0.1:0.
type grpcServer struct {
	addr string
	pay  *payments
}

// startGRPC serves payments behind recovery, outer, auth and idem (when e
// is not nil); it stops at cleanup.
func startGRPC(t testing.TB, e *idem.Engine, outer []grpc.UnaryServerInterceptor, opts ...idemgrpc.Option) *grpcServer {
	t.Helper()
	chain := append([]grpc.UnaryServerInterceptor{grpcRecovery}, outer...)
	chain = append(chain, grpcAuth)
	if e != nil {
		chain = append(chain, idemgrpc.UnaryServerInterceptor(e, append([]idemgrpc.Option{idemgrpc.WithScope(userID),
			idemgrpc.WithUnstoredMetadata("x-request-id")}, opts...)...))
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	pay := newPayments()
	srv.RegisterService(&paymentsDesc, pay)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		pay.release()
		srv.Stop()
		<-done
	})
	return &grpcServer{addr: ln.Addr().String(), pay: pay}
}

// dial returns a client connection to addr, closed at cleanup.
func dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// req is a payment request.
func req(amount float64, call string) *structpb.Struct {
	s, _ := structpb.NewStruct(map[string]any{"amount": amount, "call": call})
	return s
}

// release opens the gate for blocked executions and closes a new one for
// the next.
func (p *payments) release() {
	p.mu.Lock()
	close(p.gate)
	p.gate = make(chan struct{})
	p.mu.Unlock()
}
