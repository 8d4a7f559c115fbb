package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/adapters/idemconnect"
	"github.com/idemkit/idem/adapters/idemgrpc"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/grpc/gen/paymentsv1"
	"github.com/idemkit/idem/examples/grpc/gen/paymentsv1/paymentsv1connect"
	"github.com/idemkit/idem/examples/internal/payments"
)

// grpcServer serves CreatePayment on grpc-go at -grpc-addr (started here:
// it prints "grpc listening on ADDR") and on Connect (the Connect, gRPC and
// gRPC-Web protocols over HTTP/1.1 and h2c) at -addr, next to GET /metrics,
// both with idem through app's engine; the contract is
// examples/grpc/proto/payments/v1/payments.proto.
//
// With -recover, CreatePayment is recoverable (idemrpc.Recover, in
// payments.Open) and the recoverer runs a call whose instance crashed
// again through grpc-go's server in-process (idemgrpc.Runner), or through
// the Connect handler with -recover-connect (idemconnect.Runner); both
// authentications re-establish the stored principal.
func grpcServer(app *payments.App) (payments.Server, error) {
	grpcSrv, connectHandler := newServers(app.Engine, app.Service)
	var runner *idemgrpc.Runner
	if app.Config.Recover && !app.Config.NoIdem {
		run := idemconnect.Runner(connectHandler)
		if !app.Config.RecoverConnect {
			var err error
			if runner, err = idemgrpc.NewRunner(grpcSrv); err != nil {
				return nil, err
			}
			run = runner.Run
		}
		if err := app.Recover(run); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", app.Config.GRPCAddr)
	if err != nil {
		return nil, err
	}
	fmt.Printf("grpc listening on %s\n", ln.Addr())
	go func() { _ = grpcSrv.Serve(ln) }()

	// Connect: HTTP/1.1 and unencrypted HTTP/2 (the gRPC protocol needs HTTP/2).
	mux := http.NewServeMux()
	mux.Handle("/", connectHandler)
	mux.Handle("GET /metrics", app.Metrics)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return grpcAndConnect{srv, grpcSrv, runner}, nil
}

// grpcAndConnect shuts both servers down.
type grpcAndConnect struct {
	*http.Server
	grpc   *grpc.Server
	runner *idemgrpc.Runner // -recover's, nil without
}

// Shutdown shuts Connect down, then lets grpc-go's calls finish until ctx
// ends, when it stops them.
func (s grpcAndConnect) Shutdown(ctx context.Context) error {
	err := s.Server.Shutdown(ctx)
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
	if s.runner != nil {
		_ = s.runner.Close()
	}
	return err
}

// newServers returns the gRPC server and the Connect handler, both with idem
// on CreatePayment: recovery outermost, then authentication (which sets the
// principal), then idem, then the service.
func newServers(engine *idem.Engine, svc *payments.Service) (*grpc.Server, http.Handler) {
	api := &server{svc: svc}
	grpcSrv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recoverer,
		authenticate(engine),
		idemgrpc.UnaryServerInterceptor(engine, idemgrpc.WithScope(userID)),
	))
	paymentsv1.RegisterPaymentsServer(grpcSrv, api)

	mux := http.NewServeMux()
	mux.Handle(paymentsv1connect.NewPaymentsHandler(connectServer{api},
		connect.WithRecover(func(_ context.Context, _ connect.Spec, _ http.Header, p any) error {
			slog.Error("panic", "value", p)
			return connect.NewError(connect.CodeInternal, errors.New("the server failed; retry with the same idempotency key"))
		}),
		connect.WithInterceptors(connectAuthenticate(engine), idemconnect.NewInterceptor(engine, idemconnect.WithScope(userID))),
	))
	return grpcSrv, mux
}

type userKey struct{}

// userID returns the principal authentication stored.
func userID(ctx context.Context) string { s, _ := ctx.Value(userKey{}).(string); return s }

// authenticate stands in for real authentication: it trusts x-user-id
// metadata, or re-establishes a recovery run's stored principal
// (idemgrpc.RecoveryPrincipal).
func authenticate(engine *idem.Engine) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		if p, ok := idemgrpc.RecoveryPrincipal(ctx, engine); ok {
			return next(context.WithValue(ctx, userKey{}, p), req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		user := md.Get("x-user-id")
		if len(user) == 0 || user[0] == "" {
			return nil, status.Error(codes.Unauthenticated, "send x-user-id metadata (the examples' stand-in for authentication)")
		}
		return next(context.WithValue(ctx, userKey{}, user[0]), req)
	}
}

// connectAuthenticate is authenticate for Connect: it trusts X-User-Id,
// or re-establishes a recovery run's stored principal
// (idem.Engine.RecoveryPrincipal of the Idem-Recovery header).
func connectAuthenticate(engine *idem.Engine) connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			user, ok := engine.RecoveryPrincipal(req.Header().Get(idem.RecoveryHeader))
			if !ok {
				user = req.Header().Get("X-User-Id")
			}
			if user == "" {
				return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("send X-User-Id (the examples' stand-in for authentication)"))
			}
			return next(context.WithValue(ctx, userKey{}, user), req)
		}
	})
}

// recoverer turns a panic into Internal; idem has released the key.
func recoverer(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			slog.Error("panic", "value", p, "method", info.FullMethod)
			resp, err = nil, status.Error(codes.Internal, "the server failed; retry with the same idempotency key")
		}
	}()
	return next(ctx, req)
}

// server implements the service for grpc-go and Connect; it knows nothing
// about idem.
type server struct {
	paymentsv1.UnimplementedPaymentsServer
	svc *payments.Service
}

func (s *server) CreatePayment(ctx context.Context, req *paymentsv1.CreatePaymentRequest) (*paymentsv1.Payment, error) {
	p, err := s.charge(ctx, req)
	if err != nil {
		return nil, err
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("location", "/v1/payments/"+p.GetId()))
	return p, nil
}

// charge runs CreatePayment for both faces (connect.go has Connect's).
func (s *server) charge(ctx context.Context, req *paymentsv1.CreatePaymentRequest) (*paymentsv1.Payment, error) {
	p, err := s.svc.Charge(ctx, userID(ctx), payments.ChargeRequest{Amount: req.GetAmount(), Currency: req.GetCurrency()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &paymentsv1.Payment{Id: p.ID, Amount: p.Amount, Currency: p.Currency, UserId: p.UserID}, nil
}

// toStatus maps the domain's errors to gRPC statuses: invalid input
// InvalidArgument, a declined card FailedPrecondition (deterministic:
// idem stores it), the provider's failure Unavailable (idem releases the
// key: a retry charges again).
func toStatus(err error) error {
	var pe *payments.Error
	if !errors.As(err, &pe) {
		return status.Error(codes.Internal, err.Error())
	}
	switch pe.Status {
	case http.StatusBadRequest:
		return status.Error(codes.InvalidArgument, pe.Detail)
	case http.StatusPaymentRequired:
		st, _ := status.New(codes.FailedPrecondition, pe.Detail).WithDetails(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example"})
		return st.Err()
	case http.StatusBadGateway:
		return status.Error(codes.Unavailable, pe.Detail)
	}
	return status.Error(codes.Internal, pe.Detail)
}
