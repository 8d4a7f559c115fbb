package idemrpc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	idem "github.com/idemkit/idem/core"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
)

// Retry decides whether a call that ended with code and details (a
// status's decoded details) may be sent again with the same idempotency
// key, and after what server delay (the google.rpc.RetryInfo delay, -1
// without one). An answer of idem (an ErrorInfo of [ErrorDomain]) is
// retried by its outcome ([idem.Outcome.Retryable]: in progress and store
// unavailable only; never operation-uncertain, key-expired,
// replay-forbidden, key-reused or fingerprint-changed, whatever its code);
// o is that outcome, idem.OutcomeNone for other errors. Other errors:
// Unavailable always, Aborted and ResourceExhausted (a rate limit) only
// with a RetryInfo delay (an application's own Aborted or
// ResourceExhausted without one is its to handle); every other code never.
func Retry(code uint32, details []any) (server time.Duration, retry bool, o idem.Outcome) {
	server = RetryInfoDelay(details)
	for _, d := range details {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == ErrorDomain {
			o = OutcomeOfReason(ei.GetReason())
			return server, o.Retryable(), o
		}
	}
	return server, code == Unavailable || (code == Aborted || code == ResourceExhausted) && server >= 0, idem.OutcomeNone
}

// RetryInfoDelay returns the delay of the first google.rpc.RetryInfo among
// details (as a status's decoded details), or -1 when there is none.
func RetryInfoDelay(details []any) time.Duration {
	for _, d := range details {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(0, ri.GetRetryDelay().AsDuration())
		}
	}
	return -1
}

// Backoff spaces the attempts of one logical call.
type Backoff struct{ next, max time.Duration }

// NewBackoff returns a Backoff whose first step without a server delay is
// first, doubled at each step up to maxDelay.
func NewBackoff(first, maxDelay time.Duration) *Backoff { return &Backoff{next: first, max: maxDelay} }

// Delay returns how long to wait before the next attempt: server (a
// RetryInfo delay, >= 0) plus up to a fifth of it, so that clients told the
// same delay don't return together; or, when server < 0, the next
// exponential step, drawn from its upper half (jitter).
func (b *Backoff) Delay(server time.Duration) time.Duration {
	if server >= 0 {
		return server + rand.N(server/5+1) //nolint:gosec // jitter spreads retries; it guards no secret
	}
	d := b.next/2 + rand.N(b.next/2+1) //nolint:gosec // as above
	b.next = min(2*b.next, b.max)
	return d
}

// Wait waits d; it returns false at once when ctx's deadline comes before d
// has passed, and as soon as ctx is done.
func Wait(ctx context.Context, d time.Duration) bool {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// DefaultMaxElapsed is how long a call without a deadline keeps retrying
// by default ([Budget.MaxElapsed]): the engine's default lease
// (idem.DefaultLease, 30s), which is how long a crashed holder's record can
// answer in progress before a retry takes it over, plus [InProgressMargin]
// for the takeover's execution: 1m0s. It covers a server restarting too
// (Unavailable while it is down), as a deploy or a process manager's
// restart takes seconds.
const DefaultMaxElapsed = idem.DefaultLease + InProgressMargin

// InProgressMargin is what [DefaultMaxElapsed] adds to the engine's
// default lease: the time a takeover's execution may take to answer.
const InProgressMargin = 30 * time.Second

// Reasons a [Retrier] stopped retrying a call that still needed a retry,
// carried by [GaveUpError.Reason].
var (
	// ErrOutOfTime: the next attempt would start after the call's deadline
	// or, without one, after [Budget.MaxElapsed].
	ErrOutOfTime = errors.New("no time left for another attempt")
	// ErrAttemptsExhausted: the last send [Budget.Attempts] allows failed.
	ErrAttemptsExhausted = errors.New("attempts exhausted")
)

// Budget bounds the retries of one logical call of a client interceptor.
type Budget struct {
	// Attempts, when above 0, bounds how many times a call that fails
	// (Unavailable, a broken transport) is sent, the first included; 1
	// disables retries altogether. In-progress answers do not count. 0: no
	// count, the call's time bounds every retry.
	Attempts int
	// MaxElapsed bounds the time, from the first send, spent retrying a
	// call whose context has no deadline; a call with a deadline retries
	// until the deadline leaves no room for the next delay.
	MaxElapsed time.Duration
	// First and Max are the exponential backoff's first step and cap for
	// retries without a server delay ([NewBackoff]).
	First, Max time.Duration
}

// DefaultBudget is the client interceptors' default budget: every
// retryable answer (in progress, Unavailable, a broken transport) retried
// until the call's deadline or, without one, for [DefaultMaxElapsed]
// (1m0s), with no count of attempts; backoff from 100ms up to 5s.
var DefaultBudget = Budget{MaxElapsed: DefaultMaxElapsed, First: 100 * time.Millisecond, Max: 5 * time.Second}

// Retrier applies a [Budget] to one logical call; make one per call with
// [Budget.Start].
type Retrier struct {
	b        Budget
	backoff  *Backoff
	start    time.Time
	sends    int
	failures int
	reason   error // why Again last refused a retryable error; nil otherwise
}

// Start returns a Retrier for a call starting now.
func (b Budget) Start() *Retrier {
	return &Retrier{b: b, backoff: NewBackoff(b.First, b.Max), start: time.Now()}
}

// Again reports whether the call, whose last attempt ended with err (its
// code and details: a status's decoded details), is sent again, after
// waiting the delay: [Retry] decides whether it may be; transport reports a
// broken exchange the server sent nothing for (retryable, no server
// delay); an error a retry cannot fix ([idem.RetryCannotFix]: a DNS name
// not found, a TLS certificate refused) never is. A retryable error is
// retried while the context's deadline (or, without one, MaxElapsed from
// Start) leaves room for the delay and, when Attempts is set, fewer than
// Attempts sends failed (in-progress answers don't count). It returns false
// at once when ctx is done or its deadline would pass during the wait.
func (r *Retrier) Again(ctx context.Context, err error, code uint32, details []any, transport bool) bool {
	r.sends++
	r.reason = nil
	server, retry, o := Retry(code, details)
	if transport {
		server, retry, o = -1, true, idem.OutcomeNone
	}
	if !retry || idem.RetryCannotFix(err) {
		return false
	}
	if ctx.Err() != nil {
		r.reason = ctx.Err()
		return false
	}
	if o != idem.OutcomeInProgress {
		r.failures++
	}
	if r.b.Attempts == 1 || r.b.Attempts > 1 && o != idem.OutcomeInProgress && r.failures >= r.b.Attempts {
		r.reason = ErrAttemptsExhausted
		return false
	}
	delay := r.backoff.Delay(server)
	if _, ok := ctx.Deadline(); !ok && time.Since(r.start)+delay > r.b.MaxElapsed {
		r.reason = ErrOutOfTime
		return false
	}
	if !Wait(ctx, delay) {
		r.reason = ErrOutOfTime
		if ctx.Err() != nil {
			r.reason = ctx.Err()
		}
		return false
	}
	return true
}

// GaveUp returns err, the last attempt's error, as it is when it was final;
// when the Retrier stopped retrying it (out of time, attempts or context),
// a [*GaveUpError] wrapping it, carrying key, the idempotency key, and
// where the call sends it (keyName, e.g. `metadata "idempotency-key"`).
func (r *Retrier) GaveUp(err error, key, keyName string) error {
	if r.reason == nil {
		return err
	}
	return &GaveUpError{Key: key, KeyName: keyName, Attempts: r.sends, Elapsed: time.Since(r.start), Reason: r.reason, Err: err}
}

// GaveUpError is the error of a call the client interceptor stopped
// retrying although the last error was retryable: the call may have been
// executed. Resuming is safe: call again later with the same Key (in the
// call's KeyName), and a completed execution is replayed, not repeated.
// It wraps the last attempt's error, so status.Code, status.FromError and
// connect.CodeOf read that error's code and details (grpc-go puts this
// error's message in the status).
type GaveUpError struct {
	// Key is the idempotency key every attempt carried; KeyName is where.
	Key, KeyName string
	// Attempts is the number of sends; Elapsed the time from the first.
	Attempts int
	Elapsed  time.Duration
	// Reason is why retrying stopped: [ErrOutOfTime],
	// [ErrAttemptsExhausted], or the call context's error.
	Reason error
	// Err is the last attempt's error.
	Err error
}

// Error names the key, the attempts, the last error and how to resume.
func (e *GaveUpError) Error() string {
	return fmt.Sprintf("gave up after %d attempt(s) in %v with idempotency key %q (%v): the call may have been executed; "+
		"resume by calling again with the same key (%s: %q) to get its answer; last: %v",
		e.Attempts, e.Elapsed.Round(time.Millisecond), e.Key, e.Reason, e.KeyName, e.Key, e.Err)
}

// Unwrap returns the last attempt's error and the reason.
func (e *GaveUpError) Unwrap() []error { return []error{e.Err, e.Reason} }
