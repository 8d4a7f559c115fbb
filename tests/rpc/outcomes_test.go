package rpc

import (
	"context"
	"crypto/rand"
	"errors"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/idemkit/idem/adapters/idemconnect"
	"github.com/idemkit/idem/adapters/idemgrpc"
	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// scenario drives the engine into one outcome: a first call with the key
// through the engine first (blocked there when block is set, its lease
// left to lapse), then the asserted call, the same request (or other when
// set) through second, an engine on the same store.
type scenario struct {
	outcome       idem.Outcome
	block         bool
	other         bool
	first, second func(t *testing.T) *idem.Engine
}

// refuseReplays is a replay check that refuses every caller.
var refuseReplays = idem.WithReplayCheck(func(context.Context, idem.ReplayInfo) error {
	return errors.New("permission revoked")
})

// scenarios are the outcomes every RPC door is driven into.
func scenarios() []scenario {
	same := func(opts ...idem.Option) (func(t *testing.T) *idem.Engine, func(t *testing.T) *idem.Engine) {
		var once sync.Once
		var e *idem.Engine
		get := func(t *testing.T) *idem.Engine {
			once.Do(func() {
				s := memstore.New()
				t.Cleanup(func() { _ = s.Close() })
				e = newEngine(t, adaptertest.Crashable(s), opts...)
			})
			return e
		}
		return get, get
	}
	uncertain1, uncertain2 := same(idem.WithStoreTimeout(250*time.Millisecond), idem.WithLease(time.Second), idem.WithUncertainAfterCrash(time.Hour))
	expired1, expired2 := same(idem.WithRetention(300*time.Millisecond), idem.WithTombstones(time.Hour))
	forbidden1, forbidden2 := same(refuseReplays)
	reused1, reused2 := same()
	// fingerprint-changed: the record is made by an engine fingerprinting
	// under "v1-test"; the asserted call goes through one that does not
	// know that function.
	var shared idem.Store
	var storeOnce sync.Once
	store := func(t *testing.T) idem.Store {
		storeOnce.Do(func() {
			s := memstore.New()
			t.Cleanup(func() { _ = s.Close() })
			shared = s
		})
		return shared
	}
	v1 := idem.NewFingerprinter("v1-test", func(dst []byte, _ string, body []byte) ([]byte, error) { return append(dst, body...), nil })
	return []scenario{
		{outcome: idem.OutcomeUncertain, block: true, first: uncertain1, second: uncertain2},
		{outcome: idem.OutcomeKeyExpired, first: expired1, second: expired2},
		{outcome: idem.OutcomeReplayForbidden, first: forbidden1, second: forbidden2},
		{outcome: idem.OutcomeKeyReused, other: true, first: reused1, second: reused2},
		{outcome: idem.OutcomeFingerprintChanged,
			first:  func(t *testing.T) *idem.Engine { return newEngine(t, store(t), idem.WithFingerprint(v1)) },
			second: func(t *testing.T) *idem.Engine { return newEngine(t, store(t)) }},
	}
}

// rpcDoor is one RPC framework as the scenarios use it.
type rpcDoor struct {
	name string
	// start serves payments through e and returns its calls (plain: no
	// client interceptor; retrying: the door's), the attempts that reached
	// the server per "call" field, and the service.
	start func(t *testing.T, e *idem.Engine) (plain, retrying func(ctx context.Context, key string, in *structpb.Struct) error, seen *attempts, pay *payments)
	// status returns an error's code and decoded details.
	status func(err error) (uint32, []any)
}

var rpcDoors = []rpcDoor{
	{
		name: "grpc",
		start: func(t *testing.T, e *idem.Engine) (func(context.Context, string, *structpb.Struct) error, func(context.Context, string, *structpb.Struct) error, *attempts, *payments) {
			seen := new(attempts)
			count := func(ctx context.Context, r any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				md, _ := metadata.FromIncomingContext(ctx)
				seen.add(callOf(r), firstOf(md.Get("idempotency-key")))
				return h(ctx, r)
			}
			s := startGRPC(t, e, []grpc.UnaryServerInterceptor{count})
			plain, retrying := dial(t, s.addr), dial(t, s.addr, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
			call := func(cc *grpc.ClientConn) func(context.Context, string, *structpb.Struct) error {
				return func(ctx context.Context, key string, in *structpb.Struct) error {
					return create(ctx, cc, "alice", key, in).err
				}
			}
			return call(plain), call(retrying), seen, s.pay
		},
		status: func(err error) (uint32, []any) {
			st := status.Convert(err)
			return uint32(st.Code()), st.Details()
		},
	},
	{
		name: "connect",
		start: func(t *testing.T, e *idem.Engine) (func(context.Context, string, *structpb.Struct) error, func(context.Context, string, *structpb.Struct) error, *attempts, *payments) {
			seen := new(attempts)
			count := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
				return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
					seen.add(callOf(r.Any()), r.Header().Get("Idempotency-Key"))
					return next(ctx, r)
				}
			})
			srv, pay := startConnectWith(t, e, count)
			plain := newConnectClient(srv)
			retrying := newConnectClient(srv, connect.WithInterceptors(idemconnect.NewClientInterceptor()))
			call := func(cl *connect.Client[structpb.Struct, structpb.Struct]) func(context.Context, string, *structpb.Struct) error {
				return func(ctx context.Context, key string, in *structpb.Struct) error {
					return connectCreate(ctx, cl, "alice", key, in).err
				}
			}
			return call(plain), call(retrying), seen, pay
		},
		status: func(err error) (uint32, []any) {
			var ce *connect.Error
			if !errors.As(err, &ce) {
				return uint32(connect.CodeOf(err)), nil
			}
			var ds []any
			for _, d := range ce.Details() {
				if v, err := d.Value(); err == nil {
					ds = append(ds, v)
				}
			}
			return uint32(ce.Code()), ds
		},
	},
}

// TestRPCOutcomes drives each RPC door into uncertain, key-expired,
// replay-forbidden, key-reused and fingerprint-changed through real
// servers and asserts the documented answer (idemrpc.Code's table: code,
// ErrorInfo reason, no RetryInfo) and that the door's client interceptor
// sends the call once, not again.
func TestRPCOutcomes(t *testing.T) {
	for _, d := range rpcDoors {
		for _, sc := range scenarios() {
			t.Run(d.name+"/"+sc.outcome.String(), func(t *testing.T) {
				ctx := ctxT(t)
				plain1, _, _, pay1 := d.start(t, sc.first(t))
				plain2, retrying2, seen2, pay2 := d.start(t, sc.second(t))
				key := rand.Text()
				call := rand.Text()
				in := req(1200, call)
				firstDone := make(chan error, 1)
				if sc.block {
					in = req(amountBlock, call)
					go func() { firstDone <- plain1(ctx, key, in) }()
					<-pay1.started
				} else if err := plain1(ctx, key, in); err != nil {
					t.Fatal(err)
				}
				asserted := in
				if sc.other {
					asserted = req(1300, call)
				}
				reason := idemrpc.Reason(sc.outcome)
				// Poll with the plain client until the record reached the
				// outcome (a lease or a retention has to lapse).
				for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
					_, ds := d.status(plain2(ctx, key, asserted))
					if info := errorInfo(ds); info.GetReason() == reason {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("never answered %s", reason)
					}
				}
				before := len(seen2.of(call))
				err := retrying2(ctx, key, asserted)
				code, ds := d.status(err)
				if code != idemrpc.Code(sc.outcome) || errorInfo(ds).GetReason() != reason || errorInfo(ds).GetDomain() != idemrpc.ErrorDomain {
					t.Fatalf("%v: code %d, ErrorInfo %v; want %d %s", err, code, errorInfo(ds), idemrpc.Code(sc.outcome), reason)
				}
				if idemrpc.RetryInfoDelay(ds) >= 0 {
					t.Fatalf("%s carries RetryInfo", reason)
				}
				if n := len(seen2.of(call)) - before; n != 1 {
					t.Fatalf("the retrying client sent the call %d times; want once", n)
				}
				if sc.block {
					pay1.release()
					if err := <-firstDone; err != nil {
						t.Fatalf("the slow first call: %v", err)
					}
				}
				if n := pay1.total.Load() + pay2.total.Load(); n != 1 {
					t.Fatalf("%d executions, want 1", n)
				}
			})
		}
	}
}

func errorInfo(ds []any) *errdetails.ErrorInfo {
	for _, d := range ds {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei
		}
	}
	return nil
}

// TestSlowHandlerWithinDeadline: 20 concurrent calls with one key and a
// 20 s deadline, through each door's client interceptor with its
// defaults, on a handler that takes 5 s: the in-progress answers are
// retried within the deadline (each after its RetryInfo delay), every
// call succeeds, and the handler runs once (issue 37: with the old
// 4-attempt budget 19 of them failed after about 3.4 s).
func TestSlowHandlerWithinDeadline(t *testing.T) {
	for _, d := range rpcDoors {
		t.Run(d.name, func(t *testing.T) {
			_, retrying, _, pay := d.start(t, newEngine(t, newStore(t, "memory", "")))
			key := rand.Text()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			errs := make(chan error, 20)
			for range 20 {
				go func() { errs <- retrying(ctx, key, req(amountBlock, "slow")) }()
			}
			<-pay.started
			time.AfterFunc(5*time.Second, pay.release) // the handler takes 5 s
			for range 20 {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
			if n := pay.total.Load(); n != 1 {
				t.Fatalf("%d executions, want 1", n)
			}
		})
	}
}
