// Command grpc is idem on grpc-go in one file: one store, one method,
// graceful shutdown. payments.v1.Payments/CreatePayment (proto/) charges at
// most once per idempotency-key metadata; a retry with the same key gets
// the stored answer; a call whose server crashed mid-call is finished by the
// recoverer without its client (with a shared store). Copy this folder to start a service (its generated
// code in gen/ is imported as github.com/idemkit/idem/examples/grpc/gen/...:
// give the copy that module path or regenerate gen/, see gen.go); the full
// payments service, also on Connect, is examples/payments -framework grpc.
//
//	go run ./examples/grpc
//	grpcurl -plaintext -H 'x-user-id: alice' -H 'idempotency-key: pay-1' \
//	  -d '{"amount": 1999, "currency": "eur"}' localhost:9090 payments.v1.Payments/CreatePayment
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/adapters/idemgrpc"
	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/grpc/gen/paymentsv1"
	"github.com/idemkit/idem/stores/memstore"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9090", "listen address (port 0 picks a free one)")
	flag.Parse()
	if err := run(*addr); err != nil {
		log.Fatal(err)
	}
}

func run(addr string) error {
	// One process: memstore. Several instances share redisstore,
	// mongostore, pgstore or mysqlstore instead.
	store := memstore.New()
	defer store.Close()
	engine, err := idem.New(store, // 24h retention, 30s lease
		idemrpc.Recover(paymentsv1.Payments_CreatePayment_FullMethodName)) // a call whose server crashed is finished without its client
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		authenticate(engine),
		idemgrpc.UnaryServerInterceptor(engine, idemgrpc.WithScope(user)), // keys are scoped per caller
	))
	paymentsv1.RegisterPaymentsServer(srv, &server{})
	runner, err := idemgrpc.NewRunner(srv) // recovery runs go through srv's own interceptors, in-process
	if err != nil {
		return err
	}
	defer runner.Close()
	rec, err := idem.NewRecoverer(engine, idem.RecoverRequests(runner.Run))
	if err != nil {
		return err
	}
	rec.Start()
	defer rec.Stop() // before GracefulStop, which waits for the runs
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}

	// Serve until SIGINT or SIGTERM, then shut down gracefully: stop
	// accepting, let in-flight calls finish, and let engine.Close wait for
	// the completions it still retries after a store error.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Printf("grpc listening on %s\n", ln.Addr())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	rec.Stop()
	srv.GracefulStop()
	return engine.Close(context.Background())
}

type userKey struct{}

// user returns the principal authenticate set.
func user(ctx context.Context) string { s, _ := ctx.Value(userKey{}).(string); return s }

// authenticate stands in for your authentication: it sets the principal,
// the stored one for a recovery run (idemgrpc.RecoveryPrincipal).
func authenticate(engine *idem.Engine) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		if p, ok := idemgrpc.RecoveryPrincipal(ctx, engine); ok {
			return next(context.WithValue(ctx, userKey{}, p), req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		if u := md.Get("x-user-id"); len(u) > 0 && u[0] != "" {
			return next(context.WithValue(ctx, userKey{}, u[0]), req)
		}
		return nil, status.Error(codes.Unauthenticated, "send x-user-id metadata")
	}
}

// server implements the service; it knows nothing about idem.
type server struct {
	paymentsv1.UnimplementedPaymentsServer
	charged atomic.Int64
}

func (s *server) CreatePayment(ctx context.Context, req *paymentsv1.CreatePaymentRequest) (*paymentsv1.Payment, error) {
	if req.GetAmount() <= 0 || len(req.GetCurrency()) != 3 {
		return nil, status.Error(codes.InvalidArgument, "amount > 0 and a 3-letter currency") // stored too
	}
	n := s.charged.Add(1) // charge here: it runs once per key
	return &paymentsv1.Payment{Id: fmt.Sprintf("pay_%d", n), Amount: req.GetAmount(), Currency: req.GetCurrency(), UserId: user(ctx)}, nil
}
