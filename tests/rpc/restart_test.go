package rpc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/idemkit/idem/adapters/idemconnect"
	"github.com/idemkit/idem/adapters/idemgrpc"
	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/redisstore"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// The restart tests run this test binary as the server process: with
// restartServerEnv set to "grpc" or "connect", TestMain serves
// restartProcedure on restartAddrEnv over a Redis store under
// restartPrefixEnv (so that a process started again on the same address
// finds the records of the one killed), until it is killed.
const (
	restartServerEnv = "IDEM_RPC_RESTART_SERVER"
	restartAddrEnv   = "IDEM_RPC_RESTART_ADDR"
	restartPrefixEnv = "IDEM_RPC_RESTART_PREFIX"
	restartProcedure = "/test.v1.Restart/Charge"
	// restartLease is the server's lease: a killed holder's record answers
	// in progress for up to this long after the kill.
	restartLease = 2 * time.Second
	// restartHandler is how long an execution takes.
	restartHandler = 3 * time.Second
)

// runRestartServer is the server process: each execution prints "started"
// when it starts and "done" when it ends, takes restartHandler, and answers
// {"id": "pay_N"}, N the number of executions started on the store.
func runRestartServer(door string) int {
	opt, err := redis.ParseURL(redisURL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rc := redis.NewClient(opt)
	defer func() { _ = rc.Close() }()
	prefix := os.Getenv(restartPrefixEnv)
	e, err := idem.New(redisstore.New(rc, redisstore.WithPrefix(prefix)), idem.WithLease(restartLease), idem.WithRetention(10*time.Minute),
		idem.WithStoreTimeout(restartLease/4), idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	charge := func(ctx context.Context) (*structpb.Struct, error) {
		n, err := rc.Incr(ctx, prefix+"started").Result() // across runs: the payment's number
		if err != nil {
			return nil, err
		}
		fmt.Println("started")
		time.Sleep(restartHandler)
		fmt.Println("done")
		return structpb.NewStruct(map[string]any{"id": fmt.Sprintf("pay_%d", n)})
	}
	alice := func(context.Context) string { return "alice" }
	ln, err := net.Listen("tcp", os.Getenv(restartAddrEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	switch door {
	case "grpc":
		srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(e, idemgrpc.WithScope(alice))))
		srv.RegisterService(&grpc.ServiceDesc{
			ServiceName: "test.v1.Restart",
			HandlerType: (*any)(nil),
			Methods: []grpc.MethodDesc{{MethodName: "Charge", Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				in := new(structpb.Struct)
				if err := dec(in); err != nil {
					return nil, err
				}
				return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: restartProcedure}, func(ctx context.Context, _ any) (any, error) { return charge(ctx) })
			}}},
		}, struct{}{})
		go func() { _ = srv.Serve(ln) }()
	default:
		h := connect.NewUnaryHandler(restartProcedure, func(ctx context.Context, _ *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
			out, err := charge(ctx)
			if err != nil {
				return nil, connect.NewError(connect.CodeInternal, err)
			}
			return connect.NewResponse(out), nil
		}, connect.WithInterceptors(idemconnect.NewInterceptor(e, idemconnect.WithScope(alice))))
		srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
		go func() { _ = srv.Serve(ln) }()
	}
	fmt.Println("listening")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	<-stop // the tests kill it; SIGTERM only at their cleanup
	return 0
}

func redisURL() string {
	if u := os.Getenv("IDEM_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// startRestartable starts the server process of door on a free address,
// over fresh Redis keys (they expire with the records' retention).
func startRestartable(t *testing.T, door string) (*adaptertest.Process, string) {
	t.Helper()
	addr := adaptertest.FreeAddr(t)
	return adaptertest.StartProcess(t, os.Args[0], []string{"-test.run=^$"}, restartServerEnv+"="+door, restartAddrEnv+"="+addr,
		restartPrefixEnv+"=idemtest:rpc:restart:"+rand.Text()[:10]+":"), addr
}

// restartOutcome is what a call made across the restart ended with.
type restartOutcome struct {
	id  string
	err error
}

// checkRestart drives one restart scenario: a call (made with the
// client's default options) whose server is killed mid-execution and
// started again after down ends with the answer of the one execution that
// ran to its end (the takeover's: its id is the last start's); down < 0:
// the server never comes back, and call (made with a short budget) ends
// with an *idemrpc.GaveUpError naming key, out of time, whose last error
// has code Unavailable (unavailable).
func checkRestart(t *testing.T, s *adaptertest.Process, key string, down time.Duration, call func() restartOutcome, unavailable func(error) bool) {
	t.Helper()
	r := adaptertest.KillMidCall(t, s, down, func() bool { return s.Lines("started") > 0 }, call)
	if down < 0 {
		var g *idemrpc.GaveUpError
		if !errors.As(r.err, &g) || g.Key != key || !errors.Is(r.err, idemrpc.ErrOutOfTime) || !unavailable(r.err) || !strings.Contains(r.err.Error(), "resume") {
			t.Fatalf("call to a server that never came back: %v; want Unavailable, out of time, naming key %q to resume with", r.err, key)
		}
		return
	}
	s.Kill() // its last lines are read once it is gone: the answer can reach the client before its "done" line reaches the test
	started, done := s.Lines("started"), s.Lines("done")
	if r.err != nil || r.id != fmt.Sprintf("pay_%d", started) || done != 1 {
		t.Fatalf("server down %v: the call ended with %q, %v; %d executions started, %d ran to their end; want the one completed execution's answer pay_%d",
			down, r.id, r.err, started, done, started)
	}
	t.Logf("server down %v: the call got %s; %d executions started (the killed one and the takeover), %d completed", down, r.id, started, done)
}

// restartDowns are the scenarios: down for 2, 5 and 20 s, and never back.
var restartDowns = []time.Duration{2 * time.Second, 5 * time.Second, 20 * time.Second, -1}

// downName names a restart scenario.
func downName(down time.Duration) string {
	if down < 0 {
		return "never back"
	}
	return "down " + down.String()
}

// TestGRPCClientRidesOutRestart: a gRPC call through the client
// interceptor with its default options, whose server process is killed
// mid-execution and started again on the same address (the same Redis)
// after 2, 5 or 20 s, ends with the answer of the one execution that ran
// to its end; a server that never comes back ends the call at its time
// budget (WithMaxElapsed, short here) with the key in the error.
func TestGRPCClientRidesOutRestart(t *testing.T) {
	t.Parallel()
	for _, down := range restartDowns {
		t.Run(downName(down), func(t *testing.T) {
			t.Parallel()
			s, addr := startRestartable(t, "grpc")
			var opts []idemgrpc.ClientOption
			if down < 0 {
				opts = append(opts, idemgrpc.WithMaxElapsed(3*time.Second))
			}
			cc := dial(t, addr, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(opts...)))
			key := "pay-" + rand.Text()[:10]
			checkRestart(t, s, key, down, func() restartOutcome {
				out := new(structpb.Struct)
				ctx := metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", key)
				err := cc.Invoke(ctx, restartProcedure, req(1200, "restart"), out)
				return restartOutcome{out.GetFields()["id"].GetStringValue(), err}
			}, func(err error) bool { return status.Code(err) == codes.Unavailable })
		})
	}
}

// TestConnectClientRidesOutRestart is TestGRPCClientRidesOutRestart for
// connect-go's client interceptor (Connect protocol over HTTP/1.1).
func TestConnectClientRidesOutRestart(t *testing.T) {
	t.Parallel()
	for _, down := range restartDowns {
		t.Run(downName(down), func(t *testing.T) {
			t.Parallel()
			s, addr := startRestartable(t, "connect")
			var opts []idemconnect.ClientOption
			if down < 0 {
				opts = append(opts, idemconnect.WithMaxElapsed(3*time.Second))
			}
			hc := &http.Client{Transport: &http.Transport{}}
			t.Cleanup(hc.CloseIdleConnections)
			cl := connect.NewClient[structpb.Struct, structpb.Struct](hc, "http://"+addr+restartProcedure,
				connect.WithInterceptors(idemconnect.NewClientInterceptor(opts...)))
			key := "pay-" + rand.Text()[:10]
			checkRestart(t, s, key, down, func() restartOutcome {
				r := connect.NewRequest(req(1200, "restart"))
				r.Header().Set("Idempotency-Key", key)
				res, err := cl.CallUnary(context.Background(), r)
				if err != nil {
					return restartOutcome{err: err}
				}
				return restartOutcome{res.Msg.GetFields()["id"].GetStringValue(), nil}
			}, func(err error) bool { return connect.CodeOf(err) == connect.CodeUnavailable })
		})
	}
}
