package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	idem "github.com/idemkit/idem/core"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// RecoveryMetadata is the request metadata name carrying a recovery run's
// nonce (idem.RecoveryHeader, lowercased as gRPC names are): [Runner]
// sets it on the calls it rebuilds; the interceptor hands it to the engine,
// which adopts the recoverer's claim for a pending nonce and refuses any
// other value with PermissionDenied (reason recovery-refused), executing
// nothing.
const RecoveryMetadata = "idem-recovery"

// RecoveryPrincipal is idem.Engine.RecoveryPrincipal for a gRPC call: the
// principal stored with the recovery run whose nonce the call's
// [RecoveryMetadata] carries, ok = true only while that run is pending in
// this process. The service's authentication interceptor calls it first
// and, when ok, authenticates the call as that principal instead of
// checking a credential (a recovery run carries none); for any other call
// ok is false and it authenticates as usual:
//
//	if p, ok := idemgrpc.RecoveryPrincipal(ctx, e); ok {
//		return next(withUser(ctx, p), req) // what WithScope's function reads
//	}
func RecoveryPrincipal(ctx context.Context, e *idem.Engine) (principal string, ok bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(RecoveryMetadata)
	if len(v) == 0 {
		return "", false
	}
	return e.RecoveryPrincipal(v[0])
}

// Runner runs the recovered calls of a grpc.Server's unary methods through
// the server itself, in-process: over an in-memory listener
// (google.golang.org/grpc/test/bufconn) that the server serves besides its
// own, so that each call passes the server's whole interceptor chain
// (authentication, [UnaryServerInterceptor]) and handler as a client's call
// does. Give its Run to idem.RecoverRequests. Methods become recoverable
// with idem.WithRoute("POST", fullMethod, idem.RouteRecovery(names...))
// (idemrpc.Recover): the record then keeps the method, the request message,
// the principal, the idempotency key and the metadata lines the method
// declares; never credentials.
type Runner struct {
	lis     *bufconn.Listener
	conn    *grpc.ClientConn
	methods map[string]bool // the server's unary methods
	others  idem.Runner
	done    chan struct{}
}

// RunnerOption configures a [Runner].
type RunnerOption func(*runnerConfig)

type runnerConfig struct {
	others idem.Runner
	dial   []grpc.DialOption
}

// RunOthers sets the runner of recovered requests that are not calls of
// the server's unary methods (the engine's HTTP routes, e.g.
// idem.HTTPRunner(mux), or Connect procedures: idemconnect.Runner): one
// recoverer serves every door of an engine. Optional. Default is none:
// such requests are deferred with an error.
func RunOthers(run idem.Runner) RunnerOption { return func(c *runnerConfig) { c.others = run } }

// RunnerDialOptions adds options to the in-memory connection, after
// insecure transport credentials: e.g. grpc.WithTransportCredentials with
// a TLS configuration trusting the server's certificate when the server
// was built with grpc.Creds. Optional.
func RunnerDialOptions(opts ...grpc.DialOption) RunnerOption {
	return func(c *runnerConfig) { c.dial = append(c.dial, opts...) }
}

// NewRunner starts serving srv on an in-memory listener and returns the
// Runner of its recovered calls; [Runner.Close] stops that. Call it once
// every service is registered on srv (grpc.Server refuses registrations
// once it serves). It returns an error when the connection cannot be
// made.
func NewRunner(srv *grpc.Server, opts ...RunnerOption) (*Runner, error) {
	var c runnerConfig
	for _, o := range opts {
		o(&c)
	}
	methods := map[string]bool{}
	for name, info := range srv.GetServiceInfo() {
		for _, m := range info.Methods {
			if !m.IsClientStream && !m.IsServerStream {
				methods["/"+name+"/"+m.Name] = true
			}
		}
	}
	lis := bufconn.Listen(1 << 20)
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
	}, c.dial...)
	conn, err := grpc.NewClient("passthrough:///idem-recovery", dial...)
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: in-memory connection: %w", err)
	}
	r := &Runner{lis: lis, conn: conn, methods: methods, others: c.others, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		_ = srv.Serve(lis) // returns when lis closes or srv stops
	}()
	return r, nil
}

// Run is the idem.Runner: it calls req's method (its path, a full method
// name) on the server with req's body as the request message, as it was
// received (the bytes are sent as they are, decoded by the server's own
// codec), and, as metadata, req's header lines (the idempotency key, the
// recovery nonce, the declared lines; Content-Type aside); it returns
// [HTTPStatus] of the call's code. Requests for other paths go to
// [RunOthers]' runner.
func (r *Runner) Run(req *http.Request) (int, error) {
	if !r.methods[req.URL.Path] {
		if r.others != nil {
			return r.others(req)
		}
		return 0, fmt.Errorf("idemgrpc: %s is not a unary method of the server, and no RunOthers runner", req.URL.Path)
	}
	in := &rawMessage{}
	if req.Body != nil {
		var err error
		if in.b, err = io.ReadAll(req.Body); err != nil {
			return 0, err
		}
	}
	md := metadata.MD{}
	for k, vs := range req.Header {
		if k = strings.ToLower(k); k != "content-type" {
			md[k] = append(md[k], vs...)
		}
	}
	err := r.conn.Invoke(metadata.NewOutgoingContext(req.Context(), md), req.URL.Path, in, &rawMessage{}, grpc.ForceCodec(rawCodec{}))
	return HTTPStatus(status.Code(err)), nil
}

// Close closes the in-memory connection and listener and waits until the
// server stopped serving the listener. It does not stop the server.
func (r *Runner) Close() error {
	err := r.conn.Close()
	err = errors.Join(err, r.lis.Close())
	<-r.done
	return err
}

// rawMessage is a message as its encoded bytes.
type rawMessage struct{ b []byte }

// rawCodec passes messages through as bytes, under the name of the
// protocol buffers codec: the server decodes them with its own.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(*rawMessage)
	if !ok {
		return nil, fmt.Errorf("idemgrpc: rawCodec cannot encode %T", v)
	}
	return m.b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*rawMessage)
	if !ok {
		return fmt.Errorf("idemgrpc: rawCodec cannot decode into %T", v)
	}
	m.b = append(m.b[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }
