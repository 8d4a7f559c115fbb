package idemgrpc

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// ReplayedMetadata is the header metadata name marking a replayed response,
// with the value "true" (idem.ReplayedHeader, lowercased as gRPC names are).
const ReplayedMetadata = "idempotent-replayed"

// Option configures the server interceptor.
type Option func(*config)

type config struct {
	scope    func(context.Context) string
	key      string
	skip     func(fullMethod string) bool
	unstored map[string]bool
}

// WithScope sets the function returning the authenticated principal of a
// call (user, account or API client id), read from what the app's
// authentication interceptor stored in the context; it is part of the key's
// scope. An empty result is answered with Unauthenticated unless the engine
// has idem.WithGlobalScope. Required unless the engine uses idem.WithGlobalScope.
func WithScope(fn func(ctx context.Context) string) Option {
	return func(c *config) { c.scope = fn }
}

// WithKeyMetadata sets the request metadata name carrying the idempotency
// key. Optional. Default is the engine's header name lowercased
// ("idempotency-key").
func WithKeyMetadata(name string) Option {
	return func(c *config) { c.key = strings.ToLower(name) }
}

// WithSkip sets a predicate on the full method name ("/pkg.Service/Method")
// that, returning true, lets a call pass through untouched, e.g. reads.
// Optional. Default is nil: every unary method needs a key.
func WithSkip(fn func(fullMethod string) bool) Option { return func(c *config) { c.skip = fn } }

// WithUnstoredMetadata adds response metadata names (header or trailer)
// that are neither stored nor replayed, e.g. a per-call request id.
// Optional. Always excluded: names starting with "grpc-" or ":",
// content-type, date, and idempotent-replayed.
func WithUnstoredMetadata(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.unstored[strings.ToLower(n)] = true
		}
	}
}

// UnaryServerInterceptor returns an interceptor that runs each unary call at
// most once per idempotency key and replays the stored outcome to
// duplicates: the response message (decoded into its registered type, looked
// up by full name in protoregistry.GlobalTypes), the header and trailer
// metadata the handler set, and "idempotent-replayed: true" in the header.
// Outcomes are recorded under [HTTPStatus] of their code, so the engine's
// store policy decides what is stored. Streaming calls are not intercepted.
//
// Chain it after authentication (it reads the principal through WithScope)
// and inside any recovery interceptor: a panic in the handler releases the
// key and is re-raised. It panics without WithScope unless e has
// idem.WithGlobalScope.
func UnaryServerInterceptor(e *idem.Engine, opts ...Option) grpc.UnaryServerInterceptor {
	c := config{key: strings.ToLower(e.Header()), unstored: map[string]bool{"content-type": true, "date": true, ReplayedMetadata: true}}
	for _, o := range opts {
		o(&c)
	}
	e.MustHaveScope(c.scope != nil, "idemgrpc.WithScope")
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if c.skip != nil && c.skip(info.FullMethod) {
			return handler(ctx, req)
		}
		msg, ok := req.(proto.Message)
		if !ok {
			return nil, status.Errorf(codes.Internal, "idemgrpc: request of %s is a %T, not a protocol buffers message", info.FullMethod, req)
		}
		body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: marshal request: %v", err)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		keys := md.Get(c.key)
		principal := ""
		if c.scope != nil {
			principal = c.scope(ctx)
		}
		r := idem.Request{Method: http.MethodPost, Route: info.FullMethod, Path: info.FullMethod,
			ContentType: idemrpc.FingerprintType, Keys: keys, Principal: principal, Body: body}
		if v := md.Get(RecoveryMetadata); len(v) > 0 {
			r.Recovery = v[0]
		}
		if names := e.RecoveryHeaders(http.MethodPost, info.FullMethod); len(names) > 0 { // the metadata lines a recoverable method keeps
			r.Header = make(http.Header, len(names))
			for _, n := range names {
				if v := md.Get(n); len(v) > 0 {
					r.Header[n] = v
				}
			}
		}
		x, resp := e.Begin(ctx, &r)
		switch {
		case resp != nil && resp.IsReplay() && resp.Status != http.StatusGone: // 410: executed, response not stored
			return replay(ctx, resp)
		case resp != nil:
			st, _ := idemrpc.Answer(resp, c.key, "metadata", keys)
			return nil, status.FromProto(st).Err()
		case x == nil: // fail-open, or no key under WithKeyOptional
			return handler(ctx, req)
		}
		hctx := x.WithInfo(ctx)
		rec := &recorder{inner: grpc.ServerTransportStreamFromContext(ctx)}
		if rec.inner != nil { // nil when the interceptor is called outside a gRPC server
			hctx = grpc.NewContextWithServerTransportStream(hctx, rec)
		}
		defer func() {
			if p := recover(); p != nil {
				x.Abort(0, nil) // nothing was answered: release
				panic(p)
			}
		}()
		out, herr := handler(hctx, req)
		c.finish(x, rec, out, herr)
		if o := x.Override(); o != nil { // a step's outcome is unknown: idem answers, whatever the handler did
			st, _ := idemrpc.Answer(o, c.key, "metadata", keys)
			return nil, status.FromProto(st).Err()
		}
		return out, herr
	}
}

// finish records the handler's outcome in x.
func (c *config) finish(x *idem.Execution, rec *recorder, out any, herr error) {
	rec.mu.Lock()
	v := idemrpc.Outcome{Header: c.entries(rec.header), Trailer: c.entries(rec.trailer)}
	rec.mu.Unlock()
	code := codes.OK
	if herr != nil {
		st := status.Convert(herr)
		b, err := proto.Marshal(st.Proto())
		if err != nil {
			x.Fail()
			return
		}
		code, v.Status = st.Code(), b
	} else {
		m, ok := out.(proto.Message)
		if !ok || m == nil {
			x.Fail() // grpc answers Internal: nothing to store
			return
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			x.Fail()
			return
		}
		v.TypeName, v.Message = string(m.ProtoReflect().Descriptor().FullName()), b
	}
	_, _ = x.Write(v.Marshal())
	x.Finish(HTTPStatus(code), nil)
}

// entries returns md's storable lines, sorted by name; -bin values are kept
// as the raw bytes gRPC hands over.
func (c *config) entries(md metadata.MD) []idemrpc.Entry {
	var es []idemrpc.Entry
	for k, vs := range md {
		k = strings.ToLower(k)
		if c.unstored[k] || strings.HasPrefix(k, "grpc-") || strings.HasPrefix(k, ":") {
			continue
		}
		for _, v := range vs {
			es = append(es, idemrpc.Entry{Name: k, Value: v})
		}
	}
	sort.SliceStable(es, func(i, j int) bool { return es[i].Name < es[j].Name })
	return es
}

// replay answers a call with a stored outcome.
func replay(ctx context.Context, resp *idem.Response) (any, error) {
	var v idemrpc.Outcome
	if err := v.Unmarshal(resp.Body); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	header := metadata.Pairs(ReplayedMetadata, "true")
	for _, e := range v.Header {
		header.Append(e.Name, e.Value)
	}
	_ = grpc.SetHeader(ctx, header)
	if len(v.Trailer) > 0 {
		trailer := metadata.MD{}
		for _, e := range v.Trailer {
			trailer.Append(e.Name, e.Value)
		}
		_ = grpc.SetTrailer(ctx, trailer)
	}
	if v.Status != nil {
		var st spb.Status
		if err := proto.Unmarshal(v.Status, &st); err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: stored status unreadable: %v", err)
		}
		return nil, status.ErrorProto(&st)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(v.TypeName))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: stored response type %q is not registered in this binary: %v", v.TypeName, err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(v.Message, m); err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: stored response unreadable: %v", err)
	}
	return m, nil
}

// recorder is the grpc.ServerTransportStream the handler sees: it passes
// every call on to the call's stream and records the metadata set.
type recorder struct {
	inner           grpc.ServerTransportStream
	mu              sync.Mutex
	header, trailer metadata.MD
}

func (r *recorder) Method() string { return r.inner.Method() }

func (r *recorder) SetHeader(md metadata.MD) error {
	return r.pass(&r.header, md, r.inner.SetHeader)
}

func (r *recorder) SendHeader(md metadata.MD) error {
	return r.pass(&r.header, md, r.inner.SendHeader)
}

func (r *recorder) SetTrailer(md metadata.MD) error {
	return r.pass(&r.trailer, md, r.inner.SetTrailer)
}

// pass hands md on with the stream's method fn and records it in to when
// the stream took it.
func (r *recorder) pass(to *metadata.MD, md metadata.MD, fn func(metadata.MD) error) error {
	if err := fn(md); err != nil {
		return err
	}
	r.mu.Lock()
	*to = metadata.Join(*to, md)
	r.mu.Unlock()
	return nil
}
