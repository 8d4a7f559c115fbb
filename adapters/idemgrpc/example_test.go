package idemgrpc_test

import (
	"context"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemkit/idem/adapters/idemgrpc"
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
