package idemconnect

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"strings"

	"connectrpc.com/connect"
	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Option configures the handler interceptor.
type Option func(*config)

type config struct {
	scope    func(context.Context) string
	key      string
	skip     func(procedure string) bool
	unstored map[string]bool
}

// WithScope sets the function returning the authenticated principal of a
// call (user, account or API client id), read from what the app's
// authentication middleware or interceptor stored in the context; it is
// part of the key's scope. An empty result is answered with
// CodeUnauthenticated unless the engine has idem.WithGlobalScope. Required
// unless the engine uses idem.WithGlobalScope.
func WithScope(fn func(ctx context.Context) string) Option {
	return func(c *config) { c.scope = fn }
}

// WithKeyHeader sets the request header carrying the idempotency key.
// Optional. Default is the engine's header name ("Idempotency-Key").
func WithKeyHeader(name string) Option {
	return func(c *config) { c.key = http.CanonicalHeaderKey(name) }
}

// WithSkip sets a predicate on the procedure ("/pkg.Service/Method") that,
// returning true, lets a call pass through untouched. Optional. Default is
// nil: every unary procedure with side effects needs a key.
func WithSkip(fn func(procedure string) bool) Option { return func(c *config) { c.skip = fn } }

// WithUnstoredHeaders adds response header or trailer names that are
// neither stored nor replayed, e.g. a per-call request id. Optional. Always
// excluded: Content-Type, Content-Length, Date, names starting with
// "Grpc-" or "Connect-", and Idempotent-Replayed.
func WithUnstoredHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.unstored[strings.ToLower(n)] = true
		}
	}
}

// NewInterceptor returns a handler interceptor (connect.WithInterceptors)
// that runs each unary call at most once per idempotency key, on all three
// protocols (Connect, gRPC, gRPC-Web), and replays the stored outcome to
// duplicates: the response message, the header and trailer lines the
// handler put on its connect.Response (or on the Meta of its
// *connect.Error), and "Idempotent-Replayed: true". Outcomes are recorded
// under [HTTPStatus] of their code, so the engine's store policy decides
// what is stored. Streaming procedures, procedures declared free of side
// effects (IdempotencyNoSideEffects, which Connect may send as GET) and
// client calls pass through untouched.
//
// On a replay the response's Any() is the stored message decoded into its
// registered type, but the response is not a *connect.Response[T]:
// interceptors outside idem read it through the AnyResponse methods.
// Header lines set through the context (connect.CallInfo of simple
// handlers) are not stored. A panic in the handler releases the key and is
// re-raised. It panics without WithScope unless e has idem.WithGlobalScope.
func NewInterceptor(e *idem.Engine, opts ...Option) connect.Interceptor {
	c := config{key: e.Header(), unstored: map[string]bool{"content-type": true, "content-length": true, "date": true,
		strings.ToLower(idem.ReplayedHeader): true}}
	for _, o := range opts {
		o(&c)
	}
	e.MustHaveScope(c.scope != nil, "idemconnect.WithScope")
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			spec := req.Spec()
			if spec.IsClient || spec.IdempotencyLevel == connect.IdempotencyNoSideEffects || req.HTTPMethod() == http.MethodGet ||
				c.skip != nil && c.skip(spec.Procedure) {
				return next(ctx, req)
			}
			msg, ok := req.Any().(proto.Message)
			if !ok {
				return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: request is not a protocol buffers message"))
			}
			body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
			if err != nil {
				return nil, connect.NewError(connect.CodeInternal, err)
			}
			keys := req.Header().Values(c.key)
			principal := ""
			if c.scope != nil {
				principal = c.scope(ctx)
			}
			r := idem.Request{Method: http.MethodPost, Route: spec.Procedure, Path: spec.Procedure,
				ContentType: idemrpc.FingerprintType, Keys: keys, Principal: principal, Body: body,
				Recovery: req.Header().Get(idem.RecoveryHeader), Header: req.Header()}
			x, resp := e.Begin(ctx, &r)
			switch {
			case resp != nil && resp.IsReplay() && resp.Status != http.StatusGone: // 410: executed, response not stored
				return replay(resp)
			case resp != nil:
				return nil, statusError(idemrpc.Answer(resp, c.key, "header", keys))
			case x == nil: // fail-open, or no key under WithKeyOptional
				return next(ctx, req)
			}
			defer func() {
				if p := recover(); p != nil {
					x.Abort(0, nil) // nothing was answered: release
					panic(p)
				}
			}()
			res, herr := next(x.WithInfo(ctx), req)
			c.finish(x, res, herr)
			if o := x.Override(); o != nil { // a step's outcome is unknown: idem answers, whatever the handler did
				return nil, statusError(idemrpc.Answer(o, c.key, "header", keys))
			}
			return res, herr
		}
	})
}

// finish records the handler's outcome in x.
func (c *config) finish(x *idem.Execution, res connect.AnyResponse, herr error) {
	var v idemrpc.Outcome
	status := http.StatusOK
	if herr != nil {
		st, ce := toStatus(herr)
		if ce != nil {
			v.Header = c.entries(ce.Meta())
		}
		b, err := proto.Marshal(st)
		if err != nil {
			x.Fail()
			return
		}
		v.Status, status = b, HTTPStatus(connect.CodeOf(herr))
	} else {
		m, ok := res.Any().(proto.Message)
		if !ok {
			x.Fail()
			return
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			x.Fail()
			return
		}
		v.TypeName, v.Message = string(m.ProtoReflect().Descriptor().FullName()), b
		v.Header, v.Trailer = c.entries(res.Header()), c.entries(res.Trailer())
	}
	_, _ = x.Write(v.Marshal())
	x.Finish(status, nil)
}

// entries returns h's storable lines with lowercase names, sorted; -bin
// values are stored decoded (raw bytes), as gRPC metadata holds them.
func (c *config) entries(h http.Header) []idemrpc.Entry {
	var es []idemrpc.Entry
	for k, vs := range h {
		k = strings.ToLower(k)
		if c.unstored[k] || strings.HasPrefix(k, "grpc-") || strings.HasPrefix(k, "connect-") {
			continue
		}
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				b, err := connect.DecodeBinaryHeader(v)
				if err != nil {
					continue
				}
				v = string(b)
			}
			es = append(es, idemrpc.Entry{Name: k, Value: v})
		}
	}
	sort.SliceStable(es, func(i, j int) bool { return es[i].Name < es[j].Name })
	return es
}

// addEntries adds es to h, encoding -bin values.
func addEntries(h http.Header, es []idemrpc.Entry) {
	for _, e := range es {
		v := e.Value
		if strings.HasSuffix(e.Name, "-bin") {
			v = connect.EncodeBinaryHeader([]byte(v))
		}
		h.Add(e.Name, v)
	}
}

// replayResponse is a replayed response: Any() is the stored message.
type replayResponse struct {
	*connect.Response[emptypb.Empty]
	msg proto.Message
}

func (r *replayResponse) Any() any { return r.msg }

// replay answers a call with a stored outcome.
func replay(resp *idem.Response) (connect.AnyResponse, error) {
	var v idemrpc.Outcome
	if err := v.Unmarshal(resp.Body); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	if v.Status != nil {
		var st spb.Status
		if err := proto.Unmarshal(v.Status, &st); err != nil {
			return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: stored status unreadable"))
		}
		ce := statusError(&st, 0)
		addEntries(ce.Meta(), v.Header)
		addEntries(ce.Meta(), v.Trailer)
		ce.Meta().Set(idem.ReplayedHeader, "true")
		return nil, ce
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(v.TypeName))
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: stored response type "+v.TypeName+" is not registered in this binary"))
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(v.Message, m); err != nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: stored response unreadable"))
	}
	r := &replayResponse{Response: connect.NewResponse(&emptypb.Empty{}), msg: m}
	addEntries(r.Header(), v.Header)
	addEntries(r.Trailer(), v.Trailer)
	r.Header().Set(idem.ReplayedHeader, "true")
	return r, nil
}
