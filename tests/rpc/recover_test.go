package rpc

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/adapters/idemconnect"
	"github.com/idemkit/idem/adapters/idemgrpc"
	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
)

// heldService is the service of the in-process recovery tests: its first
// run is held (its holder looks crashed: the store renews no lease) until
// the test ends; every run reports what its handler saw.
type heldService struct {
	runs atomic.Int64
	hold chan struct{}
	seen chan seenCall
	once sync.Once
}

// seenCall is what a run's handler saw: the principal and the request's
// x-tenant and authorization lines.
type seenCall struct{ principal, tenant, authorization string }

func newHeldService(t *testing.T) *heldService {
	s := &heldService{hold: make(chan struct{}), seen: make(chan seenCall, 8)}
	t.Cleanup(s.release)
	return s
}

func (s *heldService) release() { s.once.Do(func() { close(s.hold) }) }

func (s *heldService) handle(ctx context.Context, saw seenCall) *structpb.Struct {
	n := s.runs.Add(1)
	saw.principal = userID(ctx)
	s.seen <- saw
	if n == 1 {
		<-s.hold
	}
	out, _ := structpb.NewStruct(map[string]any{"id": fmt.Sprintf("pay_%d", n)})
	return out
}

// recoveryEngine is an engine over a memory store that renews no lease,
// with 1s leases and the procedure recoverable, keeping x-tenant.
func recoveryEngine(t *testing.T) *idem.Engine {
	return newEngine(t, adaptertest.CrashableRecoverable(newStore(t, "memory", "")),
		idem.WithLease(time.Second), idem.WithStoreTimeout(250*time.Millisecond), idem.WithLogger(slog.New(slog.DiscardHandler)),
		idemrpc.Recover(procedure, "x-tenant"))
}

// TestRecoveryRefusesCredentials: a procedure cannot keep credentials for
// recovery.
func TestRecoveryRefusesCredentials(t *testing.T) {
	for _, name := range []string{"authorization", "cookie", "x-api-key"} {
		if _, err := idem.New(newStore(t, "memory", ""), idemrpc.Recover(procedure, name)); err == nil {
			t.Errorf("idemrpc.Recover(%q) accepted", name)
		}
	}
}

// TestGRPCRecovery: a call whose holder stopped, whose client gave up, is
// finished by a recoverer through idemgrpc.Runner: the run passes the
// server's interceptors as the stored principal (idemgrpc.RecoveryPrincipal)
// with the declared metadata and without the credential, and the client's
// late retry gets its answer replayed. A call carrying a forged
// idem-recovery value is refused with PermissionDenied, executing nothing.
func TestGRPCRecovery(t *testing.T) {
	e := recoveryEngine(t)
	svc := newHeldService(t)
	auth := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if p, ok := idemgrpc.RecoveryPrincipal(ctx, e); ok {
			return h(context.WithValue(ctx, principalKey{}, p), req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		if u := md.Get("x-user"); len(u) > 0 {
			return h(context.WithValue(ctx, principalKey{}, u[0]), req)
		}
		return nil, status.Error(codes.Unauthenticated, "no x-user")
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, idemgrpc.UnaryServerInterceptor(e, idemgrpc.WithScope(userID))))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: service,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: procedure}, func(ctx context.Context, _ any) (any, error) {
				md, _ := metadata.FromIncomingContext(ctx)
				return svc.handle(ctx, seenCall{tenant: strings.Join(md.Get("x-tenant"), ","), authorization: strings.Join(md.Get("authorization"), ",")}), nil
			})
		}}},
	}, nil)
	runner, err := idemgrpc.NewRunner(srv)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		svc.release()
		srv.Stop()
		<-done
		_ = runner.Close()
	})
	rec, err := idem.NewRecoverer(e, idem.RecoverRequests(runner.Run), idem.RecoverBackoff(50*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cc := dial(t, ln.Addr().String())
	send := func(ctx context.Context, extra ...string) (*structpb.Struct, metadata.MD, error) {
		ctx = metadata.AppendToOutgoingContext(ctx, append([]string{"x-user", "alice", "idempotency-key", "pay-1", "x-tenant", "acme",
			"authorization", "Bearer secret"}, extra...)...)
		out := new(structpb.Struct)
		var header metadata.MD
		err := cc.Invoke(ctx, procedure, req(1, "recover"), out, grpc.Header(&header))
		return out, header, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var client sync.WaitGroup
	client.Go(func() { _, _, _ = send(ctx) })
	first := <-svc.seen
	cancel() // the client gives up; the held run stays until the test ends
	client.Wait()
	if first.principal != "alice" || first.tenant != "acme" {
		t.Fatalf("the first run saw %+v", first)
	}
	_, _, err = send(context.Background(), idemgrpc.RecoveryMetadata, strings.Repeat("ab", 16))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "idem-recovery") || svc.runs.Load() != 1 {
		t.Fatalf("a forged idem-recovery: %v, %d runs; want PermissionDenied recovery-refused, nothing run", err, svc.runs.Load())
	}
	adaptertest.RecoverOne(t, rec)
	if got := <-svc.seen; got != (seenCall{principal: "alice", tenant: "acme"}) {
		t.Fatalf("the recovery run saw %+v; want the stored principal and x-tenant, no authorization", got)
	}
	out, header, err := send(context.Background())
	if err != nil || out.GetFields()["id"].GetStringValue() != "pay_2" || len(header.Get(idemgrpc.ReplayedMetadata)) == 0 || svc.runs.Load() != 2 {
		t.Fatalf("the late retry: %v %v (header %v, %d runs); want the recovery run's pay_2 replayed", out, err, header, svc.runs.Load())
	}
}

// TestConnectRecovery is TestGRPCRecovery on Connect, through
// idemconnect.Runner and engine.RecoveryPrincipal of the Idem-Recovery
// header.
func TestConnectRecovery(t *testing.T) {
	e := recoveryEngine(t)
	svc := newHeldService(t)
	auth := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			user, ok := e.RecoveryPrincipal(r.Header().Get(idem.RecoveryHeader))
			if !ok {
				user = r.Header().Get("X-User")
			}
			return next(context.WithValue(ctx, principalKey{}, user), r)
		}
	})
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure, func(ctx context.Context, r *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		return connect.NewResponse(svc.handle(ctx, seenCall{tenant: r.Header().Get("X-Tenant"), authorization: r.Header().Get("Authorization")})), nil
	}, connect.WithInterceptors(auth, idemconnect.NewInterceptor(e, idemconnect.WithScope(userID)))))
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		svc.release()
		srv.Close()
	})
	rec, err := idem.NewRecoverer(e, idem.RecoverRequests(idemconnect.Runner(mux)), idem.RecoverBackoff(50*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cl := connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+procedure)
	send := func(ctx context.Context, extra ...string) (*connect.Response[structpb.Struct], error) {
		r := connect.NewRequest(req(1, "recover"))
		for i, kv := 0, append([]string{"X-User", "alice", "Idempotency-Key", "pay-1", "X-Tenant", "acme", "Authorization", "Bearer secret"}, extra...); i+1 < len(kv); i += 2 {
			r.Header().Set(kv[i], kv[i+1])
		}
		return cl.CallUnary(ctx, r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var client sync.WaitGroup
	client.Go(func() { _, _ = send(ctx) })
	first := <-svc.seen
	cancel() // the client gives up; the held run stays until the test ends
	client.Wait()
	if first.principal != "alice" || first.tenant != "acme" {
		t.Fatalf("the first run saw %+v", first)
	}
	_, err = send(context.Background(), idem.RecoveryHeader, strings.Repeat("ab", 16))
	if connect.CodeOf(err) != connect.CodePermissionDenied || svc.runs.Load() != 1 {
		t.Fatalf("a forged Idem-Recovery: %v, %d runs; want PermissionDenied recovery-refused, nothing run", err, svc.runs.Load())
	}
	adaptertest.RecoverOne(t, rec)
	if got := <-svc.seen; got != (seenCall{principal: "alice", tenant: "acme"}) {
		t.Fatalf("the recovery run saw %+v; want the stored principal and X-Tenant, no Authorization", got)
	}
	res, err := send(context.Background())
	if err != nil || res.Msg.GetFields()["id"].GetStringValue() != "pay_2" || res.Header().Get(idem.ReplayedHeader) != "true" || svc.runs.Load() != 2 {
		t.Fatalf("the late retry: %v %v; want the recovery run's pay_2 replayed", res, err)
	}
}
