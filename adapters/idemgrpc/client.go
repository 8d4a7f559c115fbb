package idemgrpc

import (
	"context"
	crand "crypto/rand"
	"strings"
	"time"

	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ClientOption configures the client interceptor.
type ClientOption func(*clientConfig)

type clientConfig struct {
	key       string
	attempts  int
	base, max time.Duration
	newKey    func() string
	skip      func(fullMethod string) bool
}

// WithClientKeyMetadata sets the request metadata name carrying the
// idempotency key. Optional. Default is "idempotency-key".
func WithClientKeyMetadata(name string) ClientOption {
	return func(c *clientConfig) { c.key = strings.ToLower(name) }
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

// WithClientSkip sets a predicate on the full method name that, returning
// true, sends a call without a key and without retries. Optional. Default
// is nil: every unary call gets a key.
func WithClientSkip(fn func(fullMethod string) bool) ClientOption {
	return func(c *clientConfig) { c.skip = fn }
}

// UnaryClientInterceptor returns an interceptor that gives each logical
// unary call one idempotency key in its outgoing metadata (or keeps the one
// the caller put there) and retries it with that same key: after
// Unavailable (the server did not run it, or the answer was lost), waiting
// the google.rpc.RetryInfo delay when the status carries one, else an
// exponential backoff with jitter (server delays are spread by up to
// a fifth); and after Aborted with RetryInfo (idem's
// answer while the first attempt is still in progress). Every other outcome
// is returned at once. gRPC's own retry policy (service config) and its
// transparent retries run beneath the interceptor and re-send the same
// metadata, so they reuse the key too. The context wins: no attempt starts
// after it is done, and a retry whose delay would pass its deadline is not
// made; the last error is returned.
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	c := clientConfig{key: strings.ToLower(idem.DefaultHeader), attempts: 4, base: 100 * time.Millisecond, max: 5 * time.Second, newKey: crand.Text}
	for _, o := range opts {
		o(&c)
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if c.skip != nil && c.skip(method) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(c.key)) == 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, c.key, c.newKey())
		}
		backoff := idemrpc.NewBackoff(c.base, c.max)
		for attempt := 1; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil || attempt >= c.attempts {
				return err
			}
			delay, ok := RetryDelay(err)
			if !ok || !idemrpc.Wait(ctx, backoff.Delay(delay)) {
				return err
			}
		}
	}
}

// RetryDelay reports whether a call that failed with err may be sent again
// with the same idempotency key, and after how long: the google.rpc.RetryInfo
// delay when err carries one, else -1 (the caller picks a backoff).
// Unavailable is retryable; Aborted only with RetryInfo (idem's in-progress
// answer; other Aborted errors are the application's to handle).
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	delay := idemrpc.RetryInfoDelay(st.Details())
	return delay, idemrpc.Retryable(uint32(st.Code()), delay)
}
