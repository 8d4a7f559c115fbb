package rpc

import (
	"context"
	"errors"
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
	"github.com/idemkit/idem/adapters/idemconnect"
	"github.com/idemkit/idem/adapters/idemgrpc"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

const stepsProcedure = "/test.v1.Steps/Charge"

// stepService is a handler that calls idem.Step("charge") with the context
// its door gives it and answers {"charge", "step_key", "run"}; its first
// run waits for release after the step, as a holder that stops before
// completing.
type stepService struct {
	runs      atomic.Int64 // handler runs
	charges   atomic.Int64 // runs of the step's function
	journaled atomic.Int64 // handler runs past idem.Step
	derived   atomic.Pointer[string]
	release   chan struct{}
	once      sync.Once
	inside    bool // the first run stalls inside the step, not after it
}

func newStepService(t *testing.T) *stepService {
	s := &stepService{release: make(chan struct{})}
	t.Cleanup(s.stop)
	return s
}

func (s *stepService) stop() { s.once.Do(func() { close(s.release) }) }

func (s *stepService) charge(ctx context.Context) (*structpb.Struct, error) {
	n := s.runs.Add(1)
	key, _ := idem.StepKey(ctx, "charge")
	id, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
		if k, ok := idem.DerivedKey(ctx); ok {
			s.derived.Store(&k)
		}
		c := fmt.Sprintf("ch_%d", s.charges.Add(1))
		if s.inside && n == 1 {
			s.journaled.Add(1) // reached its stall
			select {
			case <-s.release:
			case <-time.After(20 * time.Second):
			}
		}
		return c, nil
	})
	if err != nil {
		return nil, err
	}
	s.journaled.Add(1)
	if n == 1 {
		select {
		case <-s.release:
		case <-time.After(20 * time.Second):
		}
	}
	return structpb.NewStruct(map[string]any{"charge": id, "step_key": key, "run": float64(n)})
}

// stepEngine is an engine whose holders lose their 1s lease when held in
// the handler (no renewal; store timeout 250ms), over a memstore journal.
func stepEngine(t *testing.T) *idem.Engine {
	return newEngine(t, adaptertest.CrashableJournal(newStore(t, "memory", "")),
		idem.WithLease(time.Second), idem.WithStoreTimeout(250*time.Millisecond), idem.WithLogger(slog.New(slog.DiscardHandler)))
}

// checkStepTakeover drives svc through do (one call with the idempotency
// key; inProgress tells the door's in-progress answer): the first call
// runs the step once and stalls past its lease; a retry takes the
// execution over and gets the journaled result, the step not run again,
// with the same derived key; a retry after that gets the same answer.
func checkStepTakeover(t *testing.T, svc *stepService, do func(ctx context.Context) (*structpb.Struct, error), inProgress func(error) bool) {
	t.Helper()
	ctx := ctxT(t)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = do(ctx) // the stalled holder: its answer, if any, is not the key's
	}()
	defer wg.Wait()
	defer svc.stop()
	for deadline := time.Now().Add(10 * time.Second); svc.journaled.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the first run never got past its step (step runs %d)", svc.charges.Load())
		}
	}
	derived := svc.derived.Load()
	if derived == nil {
		t.Fatalf("first run: step runs %d, none with a derived key in its ctx", svc.charges.Load())
	}
	if svc.charges.Load() != 1 || len(*derived) != 69 || !strings.HasPrefix(*derived, "idem-") {
		t.Fatalf("first run: step runs %d, derived key %q; want 1 run with idem- and 64 hex characters", svc.charges.Load(), *derived)
	}
	var took *structpb.Struct
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, err := do(ctx)
		if err == nil {
			took = out
			break
		}
		if !inProgress(err) || time.Now().After(deadline) {
			t.Fatalf("retry while the holder is stalled: %v; want in-progress until its lease lapses, then the takeover", err)
		}
	}
	f := took.GetFields()
	if f["charge"].GetStringValue() != "ch_1" || f["run"].GetNumberValue() != 2 || svc.charges.Load() != 1 {
		t.Fatalf("takeover answered %v, step runs %d; want handler run 2 with the journaled ch_1, the step not run again", took, svc.charges.Load())
	}
	if k := f["step_key"].GetStringValue(); k != *derived {
		t.Fatalf("idem.StepKey on the takeover = %q, want the first run's derived key %q", k, *derived)
	}
	svc.stop()
	wg.Wait()
	again, err := do(ctx)
	if err != nil || again.GetFields()["charge"].GetStringValue() != "ch_1" || again.GetFields()["run"].GetNumberValue() != 2 || svc.runs.Load() != 2 {
		t.Fatalf("retry after the takeover: %v, %v (handler runs %d); want the takeover's answer", again, err, svc.runs.Load())
	}
}

// checkStepUncertain drives svc (stalling inside its step) through do:
// once the stalled holder's lease lapsed, the takeover finds the step's
// outcome unknown, and the door answers idem's operation-uncertain
// (uncertain tells it) whatever the handler returned (here its own
// error), as do later retries.
func checkStepUncertain(t *testing.T, svc *stepService, do func(ctx context.Context) (*structpb.Struct, error), inProgress, uncertain func(error) bool) {
	t.Helper()
	ctx := ctxT(t)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = do(ctx)
	}()
	defer wg.Wait()
	defer svc.stop()
	for deadline := time.Now().Add(10 * time.Second); svc.journaled.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first run never reached its step")
		}
	}
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err = do(ctx); !inProgress(err) || time.Now().After(deadline) {
			break
		}
	}
	if !uncertain(err) || svc.runs.Load() != 2 || svc.charges.Load() != 1 {
		t.Fatalf("takeover of a stalled step: %v, handler runs %d, step runs %d; want operation-uncertain from run 2, the step not run again", err, svc.runs.Load(), svc.charges.Load())
	}
	if _, err = do(ctx); !uncertain(err) || svc.runs.Load() != 2 {
		t.Fatalf("retry: %v, handler runs %d; want operation-uncertain, nothing run", err, svc.runs.Load())
	}
}

// TestGRPCStepUncertainAnswered: the gRPC door answers FailedPrecondition
// OPERATION_UNCERTAIN for a takeover that finds a step's outcome unknown.
func TestGRPCStepUncertainAnswered(t *testing.T) {
	svc := newStepService(t)
	svc.inside = true
	cc := serveSteps(t, svc)
	checkStepUncertain(t, svc, func(ctx context.Context) (*structpb.Struct, error) {
		out := new(structpb.Struct)
		ctx = metadata.AppendToOutgoingContext(ctx, "x-user", "alice", "idempotency-key", "charge-2")
		return out, cc.Invoke(ctx, stepsProcedure, req(1200, "step"), out)
	}, func(err error) bool { return status.Code(err) == codes.Aborted }, func(err error) bool {
		return status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), "stopped before recording the outcome")
	})
}

// TestConnectStepUncertainAnswered: the same through Connect.
func TestConnectStepUncertainAnswered(t *testing.T) {
	svc := newStepService(t)
	svc.inside = true
	cl := serveConnectSteps(t, svc)
	checkStepUncertain(t, svc, func(ctx context.Context) (*structpb.Struct, error) {
		r := connect.NewRequest(req(1200, "step"))
		r.Header().Set("X-User", "alice")
		r.Header().Set("Idempotency-Key", "charge-2")
		res, err := cl.CallUnary(ctx, r)
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}, func(err error) bool {
		var ce *connect.Error
		return errors.As(err, &ce) && ce.Code() == connect.CodeAborted
	}, func(err error) bool {
		var ce *connect.Error
		return errors.As(err, &ce) && ce.Code() == connect.CodeFailedPrecondition && strings.Contains(ce.Message(), "stopped before recording the outcome")
	})
}

// TestGRPCStepTakeover: a gRPC handler (over TCP) calling idem.Step with
// its ctx journals the step; after a takeover the journaled result comes
// back without the step running again.
func TestGRPCStepTakeover(t *testing.T) {
	svc := newStepService(t)
	cc := serveSteps(t, svc)
	checkStepTakeover(t, svc, func(ctx context.Context) (*structpb.Struct, error) {
		out := new(structpb.Struct)
		ctx = metadata.AppendToOutgoingContext(ctx, "x-user", "alice", "idempotency-key", "charge-1")
		return out, cc.Invoke(ctx, stepsProcedure, req(1200, "step"), out)
	}, func(err error) bool { return status.Code(err) == codes.Aborted })
}

// serveSteps serves svc over gRPC (TCP) until the test ends.
func serveSteps(t *testing.T, svc *stepService) *grpc.ClientConn {
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(grpcAuth, idemgrpc.UnaryServerInterceptor(stepEngine(t), idemgrpc.WithScope(userID))))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "test.v1.Steps",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Charge", Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: stepsProcedure}, func(ctx context.Context, _ any) (any, error) {
				return svc.charge(ctx)
			})
		}}},
	}, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	t.Cleanup(svc.stop)
	return dial(t, ln.Addr().String())
}

// TestConnectStepTakeover: the same through a Connect handler (HTTP/2 over
// TCP, Connect protocol).
func TestConnectStepTakeover(t *testing.T) {
	svc := newStepService(t)
	cl := serveConnectSteps(t, svc)
	checkStepTakeover(t, svc, func(ctx context.Context) (*structpb.Struct, error) {
		r := connect.NewRequest(req(1200, "step"))
		r.Header().Set("X-User", "alice")
		r.Header().Set("Idempotency-Key", "charge-1")
		res, err := cl.CallUnary(ctx, r)
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}, func(err error) bool {
		var ce *connect.Error
		return errors.As(err, &ce) && ce.Code() == connect.CodeAborted
	})
}

// serveConnectSteps serves svc over Connect (HTTP/2, TLS) until the test
// ends.
func serveConnectSteps(t *testing.T, svc *stepService) *connect.Client[structpb.Struct, structpb.Struct] {
	h := connect.NewUnaryHandler(stepsProcedure, func(ctx context.Context, _ *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		out, err := svc.charge(ctx)
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		return connect.NewResponse(out), nil
	}, connect.WithInterceptors(connectAuth, idemconnect.NewInterceptor(stepEngine(t), idemconnect.WithScope(userID))))
	mux := http.NewServeMux()
	mux.Handle(stepsProcedure, h)
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	t.Cleanup(svc.stop)
	return connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+stepsProcedure)
}
