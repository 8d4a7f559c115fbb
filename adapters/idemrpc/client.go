package idemrpc

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
)

// Retryable reports whether a call that ended with code may be sent again
// with the same idempotency key: Unavailable always, Aborted only with a
// RetryInfo delay (server >= 0: idem's in-progress answer; other Aborted
// errors are the application's).
func Retryable(code uint32, server time.Duration) bool {
	return code == Unavailable || code == Aborted && server >= 0
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
