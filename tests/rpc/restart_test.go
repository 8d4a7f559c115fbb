package rpc

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
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

// runRestartServer is the server process: each execution counts itself in
// Redis when it starts ("started") and when it ends ("done"), takes
// restartHandler, and answers {"id": "pay_N"}, N its start's number.
func runRestartServer(door string) int {
	opt, err := redis.ParseURL(redisURL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rc := redis.NewClient(opt)
	defer func() { _ = rc.Close() }()
	prefix := os.Getenv(restartPrefixEnv)
	e, err := idem.New(redisstore.New(rc, redisstore.WithPrefix(prefix)), idem.WithLease(restartLease),
		idem.WithStoreTimeout(restartLease/4), idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	charge := func(ctx context.Context) (*structpb.Struct, error) {
		n, err := rc.Incr(ctx, prefix+"started").Result()
		if err != nil {
			return nil, err
		}
		time.Sleep(restartHandler)
		if err := rc.Incr(ctx, prefix+"done").Err(); err != nil {
			return nil, err
		}
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

// restartable is a server process that the test kills (SIGKILL) and
// starts again on the same address, over the same Redis keys.
type restartable struct {
	t            *testing.T
	door, addr   string
	prefix       string
	rc           *redis.Client
	cmd          *exec.Cmd
	exited       chan struct{}
	startedCount int
}

func startRestartable(t *testing.T, door string) *restartable {
	t.Helper()
	s := &restartable{t: t, door: door, addr: closedAddr(t), prefix: "idemtest:rpc:restart:" + rand.Text()[:10] + ":",
		rc: redis.NewClient(redisOptions(t))}
	t.Cleanup(func() {
		s.kill()
		deleteKeys(s.rc, s.prefix)
		_ = s.rc.Close()
	})
	s.start()
	return s
}

// start runs the server process and waits until it listens.
func (s *restartable) start() {
	s.t.Helper()
	s.cmd = exec.Command(os.Args[0], "-test.run=^$")
	s.cmd.Env = append(os.Environ(), restartServerEnv+"="+s.door, restartAddrEnv+"="+s.addr, restartPrefixEnv+"="+s.prefix)
	s.cmd.Stderr = os.Stderr
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.startedCount++
	s.exited = make(chan struct{})
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "listening" {
				close(listening)
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	exited := s.exited
	cmd := s.cmd
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case <-listening:
	case <-exited:
		s.t.Fatalf("%s server process %d exited before listening on %s", s.door, s.startedCount, s.addr)
	case <-time.After(2 * time.Minute):
		s.t.Fatalf("%s server process did not listen within 2 minutes", s.door)
	}
}

// kill SIGKILLs the server process, if it runs, and waits for its end.
func (s *restartable) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// count reads one of the executions' counters in Redis.
func (s *restartable) count(name string) int64 {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := s.rc.Get(ctx, s.prefix+name).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		s.t.Fatalf("redis: %v", err)
	}
	return n
}

// deleteKeys deletes the keys under prefix.
func deleteKeys(c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
	for iter.Next(ctx) {
		_ = c.Del(ctx, iter.Val()).Err()
	}
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
func checkRestart(t *testing.T, s *restartable, key string, down time.Duration, call func() restartOutcome, unavailable func(error) bool) {
	t.Helper()
	result := make(chan restartOutcome, 1)
	go func() { result <- call() }()
	for deadline := time.Now().Add(2 * time.Minute); s.count("started") < 1; time.Sleep(10 * time.Millisecond) {
		select {
		case r := <-result:
			t.Fatalf("the call ended before an execution started: %q, %v", r.id, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no execution started within 2 minutes")
		}
	}
	s.kill() // in the middle of the execution
	if down < 0 {
		r := <-result
		var g *idemrpc.GaveUpError
		if !errors.As(r.err, &g) || g.Key != key || !errors.Is(r.err, idemrpc.ErrOutOfTime) || !unavailable(r.err) || !strings.Contains(r.err.Error(), "resume") {
			t.Fatalf("call to a server that never came back: %v; want Unavailable, out of time, naming key %q to resume with", r.err, key)
		}
		return
	}
	time.Sleep(down)
	s.start()
	var r restartOutcome
	select {
	case r = <-result:
	case <-time.After(3 * time.Minute): // hang guard: the call's budget is 1 min
		t.Fatal("the call did not end within 3 minutes")
	}
	started, done := s.count("started"), s.count("done")
	if r.err != nil || r.id != fmt.Sprintf("pay_%d", started) || done != 1 {
		t.Fatalf("server down %v: the call ended with %q, %v; %d executions started, %d ran to their end; want the one completed execution's answer pay_%d",
			down, r.id, r.err, started, done, started)
	}
	t.Logf("server down %v: the call got %s; %d executions started (the killed one and the takeover), %d completed", down, r.id, started, done)
}

// restartDowns are the scenarios: down for 2, 5 and 20 s, and never back.
var restartDowns = []time.Duration{2 * time.Second, 5 * time.Second, 20 * time.Second, -1}

// TestGRPCClientRidesOutRestart: a gRPC call through the client
// interceptor with its default options, whose server process is killed
// mid-execution and started again on the same address (the same Redis)
// after 2, 5 or 20 s, ends with the answer of the one execution that ran
// to its end; a server that never comes back ends the call at its time
// budget (WithMaxElapsed, short here) with the key in the error.
func TestGRPCClientRidesOutRestart(t *testing.T) {
	t.Parallel()
	for _, down := range restartDowns {
		t.Run(fmt.Sprint(down), func(t *testing.T) {
			t.Parallel()
			s := startRestartable(t, "grpc")
			var opts []idemgrpc.ClientOption
			if down < 0 {
				opts = append(opts, idemgrpc.WithMaxElapsed(3*time.Second))
			}
			cc := dial(t, s.addr, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(opts...)))
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
		t.Run(fmt.Sprint(down), func(t *testing.T) {
			t.Parallel()
			s := startRestartable(t, "connect")
			var opts []idemconnect.ClientOption
			if down < 0 {
				opts = append(opts, idemconnect.WithMaxElapsed(3*time.Second))
			}
			hc := &http.Client{Transport: &http.Transport{}}
			t.Cleanup(hc.CloseIdleConnections)
			cl := connect.NewClient[structpb.Struct, structpb.Struct](hc, "http://"+s.addr+restartProcedure,
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
