package idemconnect

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
)

// ClientOption configures the client interceptor.
type ClientOption func(*clientConfig)

type clientConfig struct {
	key      string
	budget   idemrpc.Budget
	newKey   func() string
	fromStep bool // WithKeyFromContext
	skip     func(procedure string) bool
}

// WithClientKeyHeader sets the request header carrying the idempotency key.
// Optional. Default is "Idempotency-Key".
func WithClientKeyHeader(name string) ClientOption {
	return func(c *clientConfig) { c.key = http.CanonicalHeaderKey(name) }
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
// plumbing. A key already in the call's header wins. Optional. Default is
// off.
func WithKeyFromContext() ClientOption { return func(c *clientConfig) { c.fromStep = true } }

// WithClientSkip sets a predicate on the procedure that, returning true,
// sends a call without a key and without retries. Optional. Default is nil:
// every unary call with side effects gets a key.
func WithClientSkip(fn func(procedure string) bool) ClientOption {
	return func(c *clientConfig) { c.skip = fn }
}

// NewClientInterceptor returns a client interceptor (connect.WithInterceptors
// on a client) that gives each logical unary call one idempotency key in its
// request header (or keeps the one the caller set) and retries it with that
// same key, by [idemrpc.Budget]: idem's in-progress answer (CodeAborted,
// reason IN_PROGRESS) after its RetryInfo delay; CodeUnavailable (a refused
// connection: the server is down or restarting) or a transport failure (an
// error the client made up, not the server's, from a reset connection or a
// truncated response, which connect-go reports as CodeCanceled, CodeUnknown
// or CodeInternal) after the RetryInfo delay when the error carries one,
// else an exponential backoff with jitter capped at 5s ([WithBackoff]); an
// application's CodeAborted or CodeResourceExhausted with RetryInfo (a
// rate limit) like CodeUnavailable. All are
// retried for as long as the call's deadline leaves room for the next delay
// (without a deadline, [WithMaxElapsed], 1 min), so that a call survives a
// server restart and waits out a crashed holder's lease; [WithAttempts]
// adds a count. Server delays are spread by up to a fifth. A failure no
// retry fixes (the name does not resolve, the server's certificate is
// refused: idem.RetryCannotFix) and every other outcome are returned at
// once: idem's uncertain, key-expired, replay-forbidden, key-reused and
// fingerprint-changed answers are never retried, whatever their code. When
// the budget runs out the error is an [*idemrpc.GaveUpError] wrapping the
// last one (connect.CodeOf reads its code), naming the key to resume with.
// The context wins: no attempt starts after it is done, and a retry whose
// delay would pass its deadline is not made. Procedures free of side
// effects, streams and handler calls pass through.
func NewClientInterceptor(opts ...ClientOption) connect.Interceptor {
	c := clientConfig{key: idem.DefaultHeader, newKey: crand.Text, budget: idemrpc.DefaultBudget}
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
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			spec := req.Spec()
			if !spec.IsClient || spec.IdempotencyLevel == connect.IdempotencyNoSideEffects || c.skip != nil && c.skip(spec.Procedure) {
				return next(ctx, req)
			}
			key := req.Header().Get(c.key)
			if key == "" {
				key = newKey(ctx)
				req.Header().Set(c.key, key)
			}
			r := c.budget.Start()
			for {
				res, err := next(ctx, req)
				if err == nil {
					return res, nil
				}
				if !r.Again(ctx, err, uint32(connect.CodeOf(err)), details(err), transportFailure(ctx, err)) {
					return res, r.GaveUp(err, key, fmt.Sprintf("header %q", c.key))
				}
			}
		}
	})
}

// RetryDelay reports whether a call that failed with err may be sent again
// with the same idempotency key, and after how long: the google.rpc.RetryInfo
// delay when err carries one, else -1 (the caller picks a backoff). It is
// [idemrpc.Retry] on err's code and details: idem's answers by their
// ErrorInfo reason (IN_PROGRESS and STORE_UNAVAILABLE only), other errors
// CodeUnavailable, or CodeAborted or CodeResourceExhausted with RetryInfo.
func RetryDelay(err error) (time.Duration, bool) {
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return 0, false
	}
	delay, retry, _ := idemrpc.Retry(uint32(ce.Code()), details(err))
	return delay, retry
}

// details returns the decoded details of err (nil for an error that is not
// a *connect.Error).
func details(err error) []any {
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return nil
	}
	var ds []any
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			ds = append(ds, v)
		}
	}
	return ds
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
