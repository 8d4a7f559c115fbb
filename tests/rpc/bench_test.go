package rpc

import (
	"context"
	"crypto/rand"
	"strconv"
	"testing"

	"connectrpc.com/connect"
	"github.com/idemkit/idem/adapters/idemconnect"
	"github.com/idemkit/idem/adapters/idemgrpc"
	idem "github.com/idemkit/idem/core"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// BenchmarkUnary measures one unary call over loopback TCP, bare (no idem)
// and through the interceptor (memory store) on a fresh key or a replay,
// for grpc-go and connect-go (Connect protocol, HTTP/2 with TLS). Compare
// fresh and replay with bare of the same run (benchmarks/README: paired
// ratios).
func BenchmarkUnary(b *testing.B) {
	ctx := context.Background()
	for _, mode := range []string{"bare", "fresh", "replay"} {
		b.Run("grpc/"+mode, func(b *testing.B) {
			var s *grpcServer
			if mode == "bare" {
				s = startGRPC(b, nil, nil)
			} else {
				s = startGRPC(b, newEngine(b, newStore(b, "memory", "")), nil)
			}
			cc := dial(b, s.addr)
			_ = cc.Invoke(ctx, procedure, req(1, "warm-up"), new(structpb.Struct)) // connect before timing
			in := req(1200, "bench")
			prefix := rand.Text()
			md := metadata.AppendToOutgoingContext(ctx, "x-user", "alice", "idempotency-key", prefix)
			out := new(structpb.Struct)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				c := md
				if mode == "fresh" {
					c = metadata.AppendToOutgoingContext(ctx, "x-user", "alice", "idempotency-key", prefix+strconv.Itoa(i))
				}
				if err := cc.Invoke(c, procedure, in, out); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("connect/"+mode, func(b *testing.B) {
			var e *idem.Engine
			if mode != "bare" {
				e = newEngine(b, newStore(b, "memory", ""))
			}
			s, _ := startConnect(b, e, nil)
			cl := newConnectClient(s)
			_, _ = cl.CallUnary(ctx, connect.NewRequest(req(1, "warm-up"))) // connect before timing
			in := req(1200, "bench")
			prefix := rand.Text()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				r := connect.NewRequest(in)
				r.Header().Set("X-User", "alice")
				key := prefix
				if mode == "fresh" {
					key += strconv.Itoa(i)
				}
				r.Header().Set("Idempotency-Key", key)
				if _, err := cl.CallUnary(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkInterceptor measures the interceptors alone, in process (no
// network, so the machine's noise does not drown them): the handler
// called bare, and through the interceptor on a fresh key or a replay,
// memory store.
func BenchmarkInterceptor(b *testing.B) {
	in := req(1200, "bench")
	out, _ := structpb.NewStruct(map[string]any{"id": "pay_1", "amount": 1200})
	for _, mode := range []string{"bare", "fresh", "replay"} {
		b.Run("grpc/"+mode, func(b *testing.B) {
			handler := func(ctx context.Context, _ any) (any, error) { return out, nil }
			icpt := idemgrpc.UnaryServerInterceptor(newEngine(b, newStore(b, "memory", "")), idemgrpc.WithScope(userID))
			info := &grpc.UnaryServerInfo{FullMethod: procedure}
			base := grpc.NewContextWithServerTransportStream(context.WithValue(context.Background(), principalKey{}, "alice"), stubStream{})
			prefix := rand.Text()
			ctx := metadata.NewIncomingContext(base, metadata.Pairs("idempotency-key", prefix))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if mode == "bare" {
					_, _ = handler(ctx, in)
					continue
				}
				c := ctx
				if mode == "fresh" {
					c = metadata.NewIncomingContext(base, metadata.Pairs("idempotency-key", prefix+strconv.Itoa(i)))
				}
				if _, err := icpt(c, in, info, handler); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("connect/"+mode, func(b *testing.B) {
			next := connect.UnaryFunc(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) {
				return connect.NewResponse(out), nil
			})
			wrapped := idemconnect.NewInterceptor(newEngine(b, newStore(b, "memory", "")), idemconnect.WithScope(userID)).WrapUnary(next)
			ctx := context.WithValue(context.Background(), principalKey{}, "alice")
			prefix := rand.Text()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				r := connect.NewRequest(in)
				if mode == "bare" {
					_, _ = next(ctx, r)
					continue
				}
				key := prefix
				if mode == "fresh" {
					key += strconv.Itoa(i)
				}
				r.Header().Set("Idempotency-Key", key)
				if _, err := wrapped(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// stubStream is the call's stream a gRPC server puts in the context.
type stubStream struct{}

func (stubStream) Method() string               { return procedure }
func (stubStream) SetHeader(metadata.MD) error  { return nil }
func (stubStream) SendHeader(metadata.MD) error { return nil }
func (stubStream) SetTrailer(metadata.MD) error { return nil }
