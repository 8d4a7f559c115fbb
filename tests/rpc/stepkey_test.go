package rpc

import (
	"context"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"github.com/idemkit/idem/adapters/idemconnect"
	"github.com/idemkit/idem/adapters/idemgrpc"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestClientKeyFromStep: with WithKeyFromContext, a gRPC or Connect call
// made inside an idem.Step of the caller's execution carries the step's
// derived key (idem.DerivedKey), the same on every run of the step; a call
// outside a step gets a fresh key.
func TestClientKeyFromStep(t *testing.T) {
	ctx := ctxT(t)
	var seen attempts
	record := func(ctx context.Context, r any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		seen.add(callOf(r), firstOf(md.Get("idempotency-key")))
		return h(ctx, r)
	}
	s := startGRPC(t, newEngine(t, newStore(t, "memory", "")), []grpc.UnaryServerInterceptor{record})
	cc := dial(t, s.addr, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithKeyFromContext())))
	recordConnect := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			seen.add(callOf(r.Any()), r.Header().Get("Idempotency-Key"))
			return next(ctx, r)
		}
	})
	csrv, _ := startConnectWith(t, newEngine(t, newStore(t, "memory", "")), recordConnect)
	ccl := newConnectClient(csrv, connect.WithInterceptors(idemconnect.NewClientInterceptor(idemconnect.WithKeyFromContext())))

	// The caller: its own execution (idem.Do on a memstore), one step per door.
	store := memstore.New()
	defer store.Close()
	caller, err := idem.New(store, idem.WithGlobalScope())
	if err != nil {
		t.Fatal(err)
	}
	var derived []string
	_, err = idem.Do(ctx, caller, idem.Operation{Name: "checkout", Key: "order-1"}, func(ctx context.Context) (int, error) {
		for i, door := range []string{"grpc", "connect"} {
			_, err := idem.Step(ctx, "pay-"+door, func(ctx context.Context) (int, error) {
				key, _ := idem.DerivedKey(ctx)
				derived = append(derived, key)
				call := fmt.Sprint("step-", door)
				if door == "grpc" {
					return 0, cc.Invoke(metadata.AppendToOutgoingContext(ctx, "x-user", "alice"), procedure, req(1200, call), new(structpb.Struct))
				}
				r := connect.NewRequest(req(1200, call))
				r.Header().Set("x-user", "alice")
				_, err := ccl.CallUnary(ctx, r)
				return i, err
			})
			if err != nil {
				return 0, err
			}
		}
		return 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := seen.of("step-grpc"); len(got) != 1 || got[0] != derived[0] || len(derived[0]) != 69 {
		t.Fatalf("gRPC call in a step carried %q; want the step's derived key %q", got, derived[0])
	}
	if got := seen.of("step-connect"); len(got) != 1 || got[0] != derived[1] {
		t.Fatalf("Connect call in a step carried %q; want the step's derived key %q", got, derived[1])
	}
	if derived[0] == derived[1] {
		t.Fatalf("two steps share the derived key %q", derived[0])
	}
	if err := cc.Invoke(metadata.AppendToOutgoingContext(ctx, "x-user", "alice"), procedure, req(1200, "plain"), new(structpb.Struct)); err != nil {
		t.Fatal(err)
	}
	if got := seen.of("plain"); len(got) != 1 || got[0] == "" || got[0] == derived[0] {
		t.Fatalf("a call outside a step carried %q; want a fresh key", got)
	}
}
