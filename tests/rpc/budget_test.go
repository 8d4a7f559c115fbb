package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
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
	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// takeoverLease is the lease of the crash tests' engine: the time a retry
// after the crash waits before it can take the execution over.
const takeoverLease = 10 * time.Second

// takeoverEngine is an engine whose holders lose their 10s lease when held
// in the handler (no renewal), over a memstore journal: a holder held past
// its step is a process that crashed there.
func takeoverEngine(t *testing.T) *idem.Engine {
	return newEngine(t, adaptertest.CrashableJournal(newStore(t, "memory", "")),
		idem.WithLease(takeoverLease), idem.WithStoreTimeout(250*time.Millisecond), idem.WithLogger(slog.New(slog.DiscardHandler)))
}

// checkTakeoverWaited drives svc through first (one call without the
// client interceptor, the holder that crashes after its step) and retry
// (one call through the interceptor with default options, no deadline):
// the retry, made while the crashed holder's lease is held, waits out the
// in-progress answers until the takeover, and gets its answer, with the
// step's journaled result (one charge).
func checkTakeoverWaited(t *testing.T, svc *stepService, first, retry func(ctx context.Context) (*structpb.Struct, error)) {
	t.Helper()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer svc.stop()
	wg.Go(func() { _, _ = first(context.Background()) }) // its answer, if any, is not the key's
	for deadline := time.Now().Add(30 * time.Second); svc.journaled.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the first run never got past its step (step runs %d)", svc.charges.Load())
		}
	}
	start := time.Now()
	out, err := retry(context.Background()) // no deadline: the interceptor's default budget
	if err != nil {
		t.Fatalf("retry after the crash: %v after %v; want the takeover's answer", err, time.Since(start))
	}
	f := out.GetFields()
	if f["charge"].GetStringValue() != "ch_1" || f["run"].GetNumberValue() != 2 || svc.charges.Load() != 1 {
		t.Fatalf("retry answered %v, step runs %d; want the takeover (handler run 2) with the journaled ch_1", out, svc.charges.Load())
	}
	t.Logf("the retry got the takeover's answer %v after the crashed holder's step", time.Since(start).Round(time.Millisecond))
}

// TestGRPCClientWaitsOutTakeover: a gRPC call retried with the client
// interceptor's defaults after its holder crashed mid-handler (a 10s lease
// that is no longer renewed, Aborted IN_PROGRESS answers until it lapses)
// gets the takeover's answer; a closed port is retried for the time
// budget, and the error names the key.
func TestGRPCClientWaitsOutTakeover(t *testing.T) {
	t.Parallel()
	svc := newStepService(t)
	addr := startGRPCSteps(t, takeoverEngine(t), svc)
	plain := dial(t, addr)
	var aborted atomic.Int64
	countAborted := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if status.Code(err) == codes.Aborted {
			aborted.Add(1)
		}
		return err
	}
	retrying := dial(t, addr, grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(), countAborted))
	call := func(cc *grpc.ClientConn) func(ctx context.Context) (*structpb.Struct, error) {
		return func(ctx context.Context) (*structpb.Struct, error) {
			out := new(structpb.Struct)
			ctx = metadata.AppendToOutgoingContext(ctx, "x-user", "alice", "idempotency-key", "charge-1")
			return out, cc.Invoke(ctx, stepsProcedure, req(1200, "step"), out)
		}
	}
	checkTakeoverWaited(t, svc, call(plain), call(retrying))
	if aborted.Load() == 0 {
		t.Fatal("the retry never got an in-progress answer: the test waited for nothing")
	}
	t.Logf("%d in-progress answers waited out", aborted.Load())

	down := dial(t, adaptertest.FreeAddr(t), grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithMaxElapsed(time.Second))))
	_, err := call(down)(context.Background())
	checkGaveUp(t, err, status.Code(err) == codes.Unavailable)
}

// checkGaveUp checks the error of a call to a closed port with a short
// time budget: out of time, with the key, the last error's code (codeOK).
func checkGaveUp(t *testing.T, err error, codeOK bool) {
	t.Helper()
	var g *idemrpc.GaveUpError
	if !errors.As(err, &g) || !errors.Is(err, idemrpc.ErrOutOfTime) || g.Key != "charge-1" || !codeOK ||
		!strings.Contains(err.Error(), `"charge-1"`) || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("call to a closed port: %v; want Unavailable, out of time, naming key charge-1 to resume with", err)
	}
}

// TestConnectClientWaitsOutTakeover is TestGRPCClientWaitsOutTakeover for
// connect-go's client interceptor.
func TestConnectClientWaitsOutTakeover(t *testing.T) {
	t.Parallel()
	svc := newStepService(t)
	srv := startConnectSteps(t, takeoverEngine(t), svc)
	var aborted atomic.Int64
	count := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			res, err := next(ctx, r)
			if connect.CodeOf(err) == connect.CodeAborted {
				aborted.Add(1)
			}
			return res, err
		}
	})
	call := func(hc *http.Client, url string, opts ...connect.ClientOption) func(ctx context.Context) (*structpb.Struct, error) {
		cl := connect.NewClient[structpb.Struct, structpb.Struct](hc, url+stepsProcedure, opts...)
		return func(ctx context.Context) (*structpb.Struct, error) {
			r := connect.NewRequest(req(1200, "step"))
			r.Header().Set("X-User", "alice")
			r.Header().Set("Idempotency-Key", "charge-1")
			res, err := cl.CallUnary(ctx, r)
			if err != nil {
				return nil, err
			}
			return res.Msg, nil
		}
	}
	retrying := connect.WithInterceptors(idemconnect.NewClientInterceptor(), count)
	checkTakeoverWaited(t, svc, call(srv.Client(), srv.URL), call(srv.Client(), srv.URL, retrying))
	if aborted.Load() == 0 {
		t.Fatal("the retry never got an in-progress answer: the test waited for nothing")
	}
	t.Logf("%d in-progress answers waited out", aborted.Load())

	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	_, err := call(hc, "http://"+adaptertest.FreeAddr(t), connect.WithInterceptors(idemconnect.NewClientInterceptor(idemconnect.WithMaxElapsed(time.Second))))(context.Background())
	checkGaveUp(t, err, connect.CodeOf(err) == connect.CodeUnavailable)
}

// TestClientsStopOnUntrustedCertificate: a server whose TLS certificate
// the client does not trust is a failure no retry fixes: the gRPC and
// Connect interceptors end the call at once with it, not after their
// time budget.
func TestClientsStopOnUntrustedCertificate(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.EnableHTTP2 = true // gRPC's ALPN h2 is accepted: the handshake gets to the certificate
	srv.StartTLS()         // its certificate is signed by httptest's own CA
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")
	var sends atomic.Int64
	countSends := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		sends.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(), countSends))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	err = cc.Invoke(context.Background(), stepsProcedure, req(1200, "tls"), new(structpb.Struct))
	var g *idemrpc.GaveUpError
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "x509") || errors.As(err, &g) || sends.Load() != 1 {
		t.Errorf("gRPC call to an untrusted server: %v after %d sends; want Unavailable (x509) after one", err, sends.Load())
	}

	sends.Store(0)
	count := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			sends.Add(1)
			return next(ctx, r)
		}
	})
	hc := &http.Client{Transport: &http.Transport{}} // the system's roots: httptest's CA is not among them
	defer hc.CloseIdleConnections()
	cl := connect.NewClient[structpb.Struct, structpb.Struct](hc, srv.URL+stepsProcedure, connect.WithInterceptors(idemconnect.NewClientInterceptor(), count))
	_, err = cl.CallUnary(context.Background(), connect.NewRequest(req(1200, "tls")))
	var verify *tls.CertificateVerificationError
	if !errors.As(err, &verify) || errors.As(err, &g) || sends.Load() != 1 {
		t.Errorf("Connect call to an untrusted server: %v after %d sends; want the certificate error after one", err, sends.Load())
	}
}
