package docs

import (
	"context"
	"net/http"

	"google.golang.org/grpc"

	"github.com/idemkit/idem/adapters/idemgrpc"
	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	paymentsv1 "github.com/idemkit/idem/examples/grpc/gen/paymentsv1"
	"github.com/idemkit/idem/observability/idemui"
)

// The recovery blocks of the gRPC door (README.md, idemgrpc's doc
// comments) and the console's mounts (README.md, idemui's doc comment),
// compiled; nothing here runs.

func readmeRecoveryRPC() {
	var grpcServer *grpc.Server
	mux := http.NewServeMux()
	// doc: README.md
	engine, err := idem.New(store, idemrpc.Recover("/payments.v1.Payments/CreatePayment", "x-tenant")) // never authorization or cookies
	run, err := idemgrpc.NewRunner(grpcServer, idemgrpc.RunOthers(idem.HTTPRunner(mux)))               // after registering the services
	rec, err := idem.NewRecoverer(engine, idem.RecoverRequests(run.Run))                               // Connect: idemconnect.Runner(mux)
	// the auth interceptor: if p, ok := idemgrpc.RecoveryPrincipal(ctx, engine); ok { ctx = withUser(ctx, p) } else { check the credential }
	// doc end
	_, _ = rec, err
}

func idemgrpcRecoveryDoc() {
	var auth grpc.UnaryServerInterceptor
	var userID func(context.Context) string
	var svc paymentsv1.PaymentsServer
	// doc: adapters/idemgrpc/doc.go
	e, err := idem.New(store, idemrpc.Recover("/payments.v1.Payments/Create", "x-tenant"))
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, idemgrpc.UnaryServerInterceptor(e, idemgrpc.WithScope(userID))))
	paymentsv1.RegisterPaymentsServer(srv, svc)
	run, err := idemgrpc.NewRunner(srv)
	rec, err := idem.NewRecoverer(e, idem.RecoverRequests(run.Run))
	rec.Start()
	// doc end
	_ = err
}

func idemgrpcRecoveryPrincipalDoc(e *idem.Engine, withUser func(context.Context, string) context.Context) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		// doc: adapters/idemgrpc/recover.go
		if p, ok := idemgrpc.RecoveryPrincipal(ctx, e); ok {
			return next(withUser(ctx, p), req) // what WithScope's function reads
		}
		// doc end
		return next(ctx, req)
	}
}

func readmeConsole() {
	mux := http.NewServeMux()
	var token string
	// doc: README.md
	console := idemui.Handler(store, idemui.WithToken(token), idemui.WithWrites(nil)) // or WithWrites(yourSSO): func(*http.Request) (operator string, ok bool)
	mux.Handle("/admin/idem/", http.StripPrefix("/admin/idem", console))
	// doc end
}

func idemuiDoc() {
	mux := http.NewServeMux()
	var auth func(*http.Request) (string, bool)
	// doc: observability/idemui/idemui.go
	mux.Handle("/idem/", http.StripPrefix("/idem", idemui.Handler(store, idemui.WithWrites(auth))))
	// doc end
}
