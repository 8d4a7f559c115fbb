package idemconnect

import (
	"context"
	crand "crypto/rand"
	"errors"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
)

// ClientOption configures the client interceptor.
type ClientOption func(*clientConfig)

type clientConfig struct {
	key       string
	attempts  int
	base, max time.Duration
	newKey    func() string
	skip      func(procedure string) bool
}

// WithClientKeyHeader sets the request header carrying the idempotency key.
// Optional. Default is "Idempotency-Key".
func WithClientKeyHeader(name string) ClientOption {
	return func(c *clientConfig) { c.key = http.CanonicalHeaderKey(name) }
}

// WithAttempts sets how many times one logical call is sent at most, the
// first included; 1 disables the interceptor's own retries (the key is
// still added). Optional. Default is 4.
func WithAttempts(n int) ClientOption { return func(c *clientConfig) { c.attempts = max(1, n) } }

// WithBackoff sets the delay before the first retry of an Unavailable call
// without RetryInfo, doubled on each further retry up to maxDelay; each
// delay is drawn at random from its upper half (jitter). Optional. Default
// is 100ms, up to 5s.
func WithBackoff(first, maxDelay time.Duration) ClientOption {
	return func(c *clientConfig) { c.base, c.max = max(first, time.Millisecond), max(maxDelay, first) }
}

// WithNewKey sets the function making a fresh idempotency key for a
// logical call. Optional. Default is crypto/rand.Text (26 base32
// characters, 130 random bits).
func WithNewKey(fn func() string) ClientOption { return func(c *clientConfig) { c.newKey = fn } }

// WithClientSkip sets a predicate on the procedure that, returning true,
// sends a call without a key and without retries. Optional. Default is nil:
// every unary call with side effects gets a key.
func WithClientSkip(fn func(procedure string) bool) ClientOption {
	return func(c *clientConfig) { c.skip = fn }
}

// NewClientInterceptor returns a client interceptor (connect.WithInterceptors
// on a client) that gives each logical unary call one idempotency key in its
// request header (or keeps the one the caller set) and retries it with that
// same key: after CodeUnavailable or a transport failure (an error the
// client made up, not the server's, from a reset connection or a truncated
// response, which connect-go reports as CodeCanceled, CodeUnknown or
// CodeInternal), waiting the google.rpc.RetryInfo delay
// when the error carries one (spread by up to a fifth), else an exponential
// backoff with jitter; and after CodeAborted with RetryInfo (idem's answer
// while the first attempt is in progress). Every other outcome is returned
// at once. The context wins: no attempt starts after it is done, and a
// retry whose delay would pass its deadline is not made; the last error is
// returned. Procedures free of side effects, streams and handler calls pass
// through.
func NewClientInterceptor(opts ...ClientOption) connect.Interceptor {
	c := clientConfig{key: idem.DefaultHeader, attempts: 4, base: 100 * time.Millisecond, max: 5 * time.Second, newKey: crand.Text}
	for _, o := range opts {
		o(&c)
	}
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			spec := req.Spec()
			if !spec.IsClient || spec.IdempotencyLevel == connect.IdempotencyNoSideEffects || c.skip != nil && c.skip(spec.Procedure) {
				return next(ctx, req)
			}
			if req.Header().Get(c.key) == "" {
				req.Header().Set(c.key, c.newKey())
			}
			backoff := idemrpc.NewBackoff(c.base, c.max)
			for attempt := 1; ; attempt++ {
				res, err := next(ctx, req)
				if err == nil || attempt >= c.attempts {
					return res, err
				}
				delay, ok := RetryDelay(err)
				if !ok && transportFailure(ctx, err) {
					delay, ok = -1, true
				}
				if !ok || !idemrpc.Wait(ctx, backoff.Delay(delay)) {
					return res, err
				}
			}
		}
	})
}

// RetryDelay reports whether a call that failed with err may be sent again
// with the same idempotency key, and after how long: the google.rpc.RetryInfo
// delay when err carries one, else -1 (the caller picks a backoff).
// CodeUnavailable is retryable; CodeAborted only with RetryInfo (idem's
// in-progress answer).
func RetryDelay(err error) (time.Duration, bool) {
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return 0, false
	}
	var details []any
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			details = append(details, v)
		}
	}
	delay := idemrpc.RetryInfoDelay(details)
	return delay, idemrpc.Retryable(uint32(ce.Code()), delay)
}

// transportFailure reports whether err is the client's own report of a
// broken exchange while ctx is live, not an error the server sent: a
// connection reset or closed, a response cut short (connect-go gives
// these CodeCanceled, CodeUnknown or CodeInternal; the server may or may
// not have run the call, and the key makes a retry safe either way).
func transportFailure(ctx context.Context, err error) bool {
	if ctx.Err() != nil || connect.IsWireError(err) {
		return false
	}
	switch connect.CodeOf(err) {
	case connect.CodeCanceled, connect.CodeUnknown, connect.CodeInternal:
		return true
	}
	return false
}
