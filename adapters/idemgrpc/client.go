package idemgrpc

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ClientOption configures the client interceptor.
type ClientOption func(*clientConfig)

type clientConfig struct {
	key      string
	budget   idemrpc.Budget
	newKey   func() string
	fromStep bool // WithKeyFromContext
	skip     func(fullMethod string) bool
}

// WithClientKeyMetadata sets the request metadata name carrying the
// idempotency key. Optional. Default is "idempotency-key".
func WithClientKeyMetadata(name string) ClientOption {
	return func(c *clientConfig) { c.key = strings.ToLower(name) }
}

// WithAttempts sets how many times a logical call that fails
// (Unavailable, a broken transport) is sent at most, the first included,
// within the time [WithMaxElapsed] gives; 1 disables the interceptor's own
// retries (the key is still added). In-progress answers do not count.
// Optional. Default is none: the time bounds the retries.
func WithAttempts(n int) ClientOption { return func(c *clientConfig) { c.budget.Attempts = max(1, n) } }

// WithMaxElapsed bounds how long, from its first send, a call whose
// context has no deadline keeps retrying: Unavailable and broken
// transports (a server restarting) and idem's in-progress answers (each
// after its RetryInfo delay); a call with a deadline retries until the
// deadline leaves no room for the next delay, whatever this is. Optional.
// Default is [idemrpc.DefaultMaxElapsed] (1m0s: the engine's default lease
// of 30s, which a crashed holder's record can take to lapse before a retry
// takes it over, plus a 30s margin for the takeover's execution).
func WithMaxElapsed(d time.Duration) ClientOption {
	return func(c *clientConfig) { c.budget.MaxElapsed = d }
}

// WithBackoff sets the delay before the first retry of an Unavailable call
// without RetryInfo, doubled on each further retry up to maxDelay; each
// delay is drawn at random from its upper half (jitter). Optional. Default
// is 100ms, up to 5s.
func WithBackoff(first, maxDelay time.Duration) ClientOption {
	return func(c *clientConfig) {
		c.budget.First, c.budget.Max = max(first, time.Millisecond), max(maxDelay, first)
	}
}

// WithNewKey sets the function making a fresh idempotency key for a
// logical call. Optional. Default is crypto/rand.Text (26 base32
// characters, 130 random bits).
func WithNewKey(fn func() string) ClientOption { return func(c *clientConfig) { c.newKey = fn } }

// WithKeyFromContext makes a call made inside an idem.Step of the calling
// service's execution carry the step's derived key (idem.DerivedKey: the
// same on every run and takeover of that execution) instead of a fresh
// one, so that a chain of idem services stays exactly-once with no key
// plumbing. A key already in the call's metadata wins. Optional. Default is
// off.
func WithKeyFromContext() ClientOption { return func(c *clientConfig) { c.fromStep = true } }

// WithClientSkip sets a predicate on the full method name that, returning
// true, sends a call without a key and without retries. Optional. Default
// is nil: every unary call gets a key.
func WithClientSkip(fn func(fullMethod string) bool) ClientOption {
	return func(c *clientConfig) { c.skip = fn }
}

// UnaryClientInterceptor returns an interceptor that gives each logical
// unary call one idempotency key in its outgoing metadata (or keeps the one
// the caller put there) and retries it with that same key, by
// [idemrpc.Budget]: idem's in-progress answer (Aborted, reason IN_PROGRESS)
// after its RetryInfo delay; Unavailable (the server is down or
// restarting, did not run the call, or its answer was lost) after the
// RetryInfo delay when the status carries one, else an exponential backoff
// with jitter capped at 5s ([WithBackoff]); an application's Aborted or
// ResourceExhausted with RetryInfo (a rate limit) like Unavailable. All
// are retried for as long as the call's deadline leaves room for the next
// delay (without a deadline,
// [WithMaxElapsed], 1 min), so that a call survives a server restart and
// waits out a crashed holder's lease; [WithAttempts] adds a count. Server
// delays are spread by up to a fifth. An Unavailable no retry fixes (the
// name does not resolve, the server's certificate is refused:
// idem.RetryCannotFix on its message) and every other outcome are returned
// at once: idem's uncertain, key-expired, replay-forbidden, key-reused and
// fingerprint-changed answers are never retried, whatever their code
// ([RetryDelay]). When the budget runs out the error is an
// [*idemrpc.GaveUpError] wrapping the last one (status.Code reads its
// code), naming the key to resume with. gRPC's own retry policy (service
// config) and its transparent retries run beneath the interceptor and
// re-send the same metadata, so they reuse the key too. A retry on a
// channel in TRANSIENT_FAILURE first resets its reconnect backoff
// (ClientConn.ResetConnectBackoff), so that a restarted server is dialled
// on the interceptor's backoff, not after the channel's own (growing to
// 2 min by default). The context wins:
// no attempt starts after it is done, and a retry whose delay would pass
// its deadline is not made.
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	c := clientConfig{key: strings.ToLower(idem.DefaultHeader), newKey: crand.Text, budget: idemrpc.DefaultBudget}
	for _, o := range opts {
		o(&c)
	}
	newKey := func(ctx context.Context) string {
		if c.fromStep {
			if key, ok := idem.DerivedKey(ctx); ok {
				return key
			}
		}
		return c.newKey()
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if c.skip != nil && c.skip(method) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		md, _ := metadata.FromOutgoingContext(ctx)
		key := firstOf(md.Get(c.key))
		if key == "" {
			key = newKey(ctx)
			ctx = metadata.AppendToOutgoingContext(ctx, c.key, key)
		}
		r := c.budget.Start()
		for n := 0; ; n++ {
			if n > 0 && cc.GetState() == connectivity.TransientFailure {
				// The channel waits out its own reconnect backoff (up to
				// 2 min) before it dials again; the retry's own backoff
				// is the one that counts.
				cc.ResetConnectBackoff()
			}
			err := invoker(ctx, method, req, reply, cc, opts...)
			st, ok := status.FromError(err)
			if err == nil || !ok {
				return err
			}
			if !r.Again(ctx, errors.New(st.Message()), uint32(st.Code()), st.Details(), false) {
				return r.GaveUp(err, key, fmt.Sprintf("metadata %q", c.key))
			}
		}
	}
}

// firstOf returns the first of vs, "" when there is none.
func firstOf(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// RetryDelay reports whether a call that failed with err may be sent again
// with the same idempotency key, and after how long: the google.rpc.RetryInfo
// delay when err carries one, else -1 (the caller picks a backoff). It is
// [idemrpc.Retry] on err's status: idem's answers by their ErrorInfo
// reason (IN_PROGRESS and STORE_UNAVAILABLE only), other errors
// Unavailable, or Aborted or ResourceExhausted with RetryInfo.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	delay, retry, _ := idemrpc.Retry(uint32(st.Code()), st.Details())
	return delay, retry
}
