package idemgrpc_test

import (
	"context"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemkit/idem/adapters/idemgrpc"
	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
)

// store is the application's [idem.Store]: memstore.New() for one process,
// redisstore, mongostore or pgstore for several instances. The example
// leaves it unset so that this module does not require a store module
// (running tests live in tests/rpc).
var store idem.Store

type userKey struct{}

// userID returns the principal the app's authentication interceptor stored.
func userID(ctx context.Context) string { s, _ := ctx.Value(userKey{}).(string); return s }

// auth and recovery stand in for the app's own interceptors.
var auth, recovery grpc.UnaryServerInterceptor

func Example() {
	engine, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recovery, // outside idem: a panic has released the key when it gets here
		auth,     // sets the principal userID reads
		idemgrpc.UnaryServerInterceptor(engine, idemgrpc.WithScope(userID)),
	))
	_ = srv // register services, then srv.Serve(listener)
}

func ExampleUnaryClientInterceptor() {
	conn, err := grpc.NewClient("payments.internal:443",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// One idempotency-key per logical call, reused by every retry.
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithAttempts(5))),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
}

func ExampleNewRunner() {
	engine, err := idem.New(store,
		idemrpc.Recover("/payments.v1.Payments/Create", "x-tenant")) // never authorization or cookies
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			if p, ok := idemgrpc.RecoveryPrincipal(ctx, engine); ok { // a recovery run: the stored principal
				return next(context.WithValue(ctx, userKey{}, p), req)
			}
			return auth(ctx, req, nil, next) // every other call, a forged idem-recovery included
		},
		idemgrpc.UnaryServerInterceptor(engine, idemgrpc.WithScope(userID)),
	))
	// register the services on srv first
	run, err := idemgrpc.NewRunner(srv)
	if err != nil {
		log.Fatal(err)
	}
	defer run.Close()
	rec, err := idem.NewRecoverer(engine, idem.RecoverRequests(run.Run))
	if err != nil {
		log.Fatal(err)
	}
	rec.Start()
	defer rec.Stop()
}
