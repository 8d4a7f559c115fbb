package idemrpc

import (
	"context"
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
// Unavailable always, Aborted only with a RetryInfo delay (an
// application's own Aborted without one is its to handle).
func Retry(code uint32, details []any) (server time.Duration, retry bool, o idem.Outcome) {
	server = RetryInfoDelay(details)
	for _, d := range details {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == ErrorDomain {
			o = OutcomeOfReason(ei.GetReason())
			return server, o.Retryable(), o
		}
	}
	return server, code == Unavailable || code == Aborted && server >= 0, idem.OutcomeNone
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

// DefaultInProgressWait is how long a call without a deadline keeps
// retrying in-progress answers by default ([Budget.InProgressWait]): the
// engine's default lease (idem.DefaultLease, 30s), which is how long a
// crashed holder's record can answer in progress before a retry takes it
// over, plus [InProgressMargin] for the takeover's execution: 1m0s.
const DefaultInProgressWait = idem.DefaultLease + InProgressMargin

// InProgressMargin is what [DefaultInProgressWait] adds to the engine's
// default lease: the time a takeover's execution may take to answer.
const InProgressMargin = 30 * time.Second

// Budget bounds the attempts of one logical call of a client interceptor.
type Budget struct {
	// Attempts is how many times a call that fails (Unavailable, a broken
	// transport) is sent at most, the first included; 1 disables retries
	// altogether. In-progress answers do not count: they are retried within
	// the call's deadline, or InProgressWait without one.
	Attempts int
	// InProgressWait bounds the time spent retrying in-progress answers of
	// a call whose context has no deadline.
	InProgressWait time.Duration
	// First and Max are the exponential backoff's first step and cap for
	// retries without a server delay ([NewBackoff]).
	First, Max time.Duration
}

// DefaultBudget is the client interceptors' default budget: 4 sends of a
// failing call, in-progress answers retried until the call's deadline or,
// without one, for [DefaultInProgressWait] (1m0s), backoff from 100ms up
// to 5s.
var DefaultBudget = Budget{Attempts: 4, InProgressWait: DefaultInProgressWait, First: 100 * time.Millisecond, Max: 5 * time.Second}

// Retrier applies a [Budget] to one logical call; make one per call with
// [Budget.Start].
type Retrier struct {
	b        Budget
	backoff  *Backoff
	start    time.Time
	failures int
}

// Start returns a Retrier for a call starting now.
func (b Budget) Start() *Retrier {
	return &Retrier{b: b, backoff: NewBackoff(b.First, b.Max), start: time.Now()}
}

// Again reports whether the call, whose last attempt ended with code and
// details (a status's decoded details), is sent again, after waiting the
// delay: [Retry] decides whether it may be; transport reports a broken
// exchange the server sent nothing for (retryable, no server delay). An
// in-progress answer is retried while the context's deadline (or, without
// one, InProgressWait from Start) leaves room for its RetryInfo delay;
// other retryable errors while fewer than Attempts sends failed. It returns
// false at once when ctx is done or its deadline would pass during the
// wait.
func (r *Retrier) Again(ctx context.Context, code uint32, details []any, transport bool) bool {
	if r.b.Attempts <= 1 || ctx.Err() != nil {
		return false
	}
	server, retry, o := Retry(code, details)
	if transport {
		server, retry, o = -1, true, idem.OutcomeNone
	}
	if !retry {
		return false
	}
	delay := r.backoff.Delay(server)
	if o == idem.OutcomeInProgress {
		if _, ok := ctx.Deadline(); !ok && time.Since(r.start)+delay > r.b.InProgressWait {
			return false
		}
	} else if r.failures++; r.failures >= r.b.Attempts {
		return false
	}
	return Wait(ctx, delay)
}
