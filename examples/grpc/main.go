// Command grpc is the payments API as a gRPC service (grpc-go, on
// -grpc-addr) and the same service on Connect (connect-go: the Connect,
// gRPC and gRPC-Web protocols over HTTP/1.1 and h2c, on -addr), both with
// idem on CreatePayment through one engine and one store. run below wires
// everything, top to bottom. Run it with
//
//	go run ./examples/grpc -store memory
//
// and call it with grpcurl, buf curl or a generated client, sending
// idempotency-key metadata (Idempotency-Key on Connect) and x-user-id.
// The contract is proto/payments/v1/payments.proto.
//
// This folder is a complete program, copyable on its own (README.md,
// "Running an example as your own module"; its generated code in gen/ is
// imported as github.com/idemkit/idem/examples/grpc/gen/..., so give the
// copy that module path or regenerate gen/ with yours): main.go and
// connect.go are the wiring; store.go (the command line, the store and its
// purger, the payments ledger), telemetry.go (/metrics, traces) and
// payments.go (the fake domain) are the same in every example folder,
// duplicated so that each folder stands alone.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
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
	"github.com/idemkit/idem/observability/idemotel"
)

var grpcAddr = flag.String("grpc-addr", "127.0.0.1:9090", "grpc-go listen address (port 0 picks a free one)")

func main() {
	if err := run(parseFlags()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(flags config) error {
	// The store -store names (store.go): memory for one process; Redis,
	// MongoDB, PostgreSQL or MySQL shared by several instances. The SQL
	// stores run a purger that deletes expired records; closeStore stops it.
	store, closeStore, err := openStore(flags)
	if err != nil {
		return err
	}
	defer closeStore()

	// Telemetry (telemetry.go): OpenTelemetry metrics served on GET /metrics
	// (Prometheus text) next to Connect, spans to -trace-file. idemotel
	// turns the engine's events into metrics and span attributes.
	metrics, stopTelemetry, err := telemetry(flags)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	hook, err := idemotel.NewEventHook()
	if err != nil {
		return err
	}

	// The engine: the same rules as the HTTP examples'.
	engine, err := idem.New(store,
		idem.WithRetention(flags.TTL),
		idem.WithLease(flags.Lease),
		idem.WithStoreTimeout(flags.StoreTimeout),
		idem.WithUncertainAfterCrash(flags.UncertainAfterCrash),
		idem.WithEventHook(hook),
	)
	if err != nil {
		return err
	}

	// The payments ledger (store.go): with -store postgres or mysql each
	// payment is a row written through the execution's transaction
	// (pgstore.Tx, mysqlstore.Tx), committed with the stored response.
	ledger, closeLedger, err := openLedger(flags)
	if err != nil {
		return err
	}
	defer closeLedger()
	svc := newService(flags.ChargeLatency, ledger)
	grpcSrv, connectHandler := newServers(engine, svc)
	ln, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		return err
	}
	fmt.Printf("grpc listening on %s\n", ln.Addr())
	go func() { _ = grpcSrv.Serve(ln) }()
	defer grpcSrv.GracefulStop()

	// Connect: HTTP/1.1 and unencrypted HTTP/2 (the gRPC protocol needs HTTP/2).
	mux := http.NewServeMux()
	mux.Handle("/", connectHandler)
	mux.Handle("GET /metrics", metrics)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return serve(flags.Addr, srv, engine, svc)
}

// newServers returns the gRPC server and the Connect handler, both with idem
// on CreatePayment: recovery outermost, then authentication (which sets the
// principal), then idem, then the service.
func newServers(engine *idem.Engine, svc *Service) (*grpc.Server, http.Handler) {
	api := &server{svc: svc}
	grpcSrv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recoverer,
		authenticate,
		idemgrpc.UnaryServerInterceptor(engine, idemgrpc.WithScope(userID)),
	))
	paymentsv1.RegisterPaymentsServer(grpcSrv, api)

	mux := http.NewServeMux()
	mux.Handle(paymentsv1connect.NewPaymentsHandler(connectServer{api},
		connect.WithRecover(func(_ context.Context, _ connect.Spec, _ http.Header, p any) error {
			slog.Error("panic", "value", p)
			return connect.NewError(connect.CodeInternal, errors.New("the server failed; retry with the same idempotency key"))
		}),
		connect.WithInterceptors(connectAuthenticate, idemconnect.NewInterceptor(engine, idemconnect.WithScope(userID))),
	))
	return grpcSrv, mux
}

type userKey struct{}

// userID returns the principal authentication stored.
func userID(ctx context.Context) string { s, _ := ctx.Value(userKey{}).(string); return s }

// authenticate stands in for real authentication: it trusts x-user-id metadata.
func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	user := md.Get("x-user-id")
	if len(user) == 0 || user[0] == "" {
		return nil, status.Error(codes.Unauthenticated, "send x-user-id metadata (the examples' stand-in for authentication)")
	}
	return next(context.WithValue(ctx, userKey{}, user[0]), req)
}

// connectAuthenticate is authenticate for Connect: it trusts X-User-Id.
var connectAuthenticate = connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		user := req.Header().Get("X-User-Id")
		if user == "" {
			return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("send X-User-Id (the examples' stand-in for authentication)"))
		}
		return next(context.WithValue(ctx, userKey{}, user), req)
	}
})

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
	svc *Service
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
	p, err := s.svc.Charge(ctx, userID(ctx), ChargeRequest{Amount: req.GetAmount(), Currency: req.GetCurrency()})
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
	var pe *Error
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

// serve listens on addr, prints "listening on http://ADDR" once it accepts
// connections, and serves srv until SIGINT or SIGTERM. Then it shuts down
// gracefully: srv stops accepting and lets in-flight requests finish, then
// engine.Close waits for the completions the engine is still retrying after
// a store error, all within 10s (more than the 5s net/http waits for a
// connection that has not sent a request yet). Last it prints
// "executions N", the provider executions (tests/chaos reads both lines).
func serve(addr string, srv *http.Server, engine *idem.Engine, svc *Service) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening on http://%s\n", ln.Addr()) // after the signal handler: a SIGTERM from now on shuts down cleanly
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	if err := engine.Close(shutdown); err != nil {
		slog.Warn("idem: completions still retrying were abandoned", "err", err)
	}
	fmt.Printf("executions %d\n", svc.Stats().Executions)
	return nil
}
