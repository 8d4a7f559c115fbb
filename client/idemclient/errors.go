package idemclient

import (
	"errors"
	"fmt"
	"time"
)

// Reasons a [Transport] stops retrying, carried by [GaveUpError.Reason] and
// matched with errors.Is on the error RoundTrip (or http.Client.Do) returns.
var (
	// ErrAttemptsExhausted: the last allowed attempt ([WithMaxAttempts]) failed.
	ErrAttemptsExhausted = errors.New("idemclient: attempts exhausted")
	// ErrOutOfTime: the next attempt would start after the total time bound
	// ([WithMaxElapsed]) or after the request context's deadline.
	ErrOutOfTime = errors.New("idemclient: no time left for another attempt")
	// ErrRetryAfterTooLong: the server's Retry-After asked for a longer wait
	// than [WithMaxRetryAfter] allows.
	ErrRetryAfterTooLong = errors.New("idemclient: Retry-After longer than allowed")
	// ErrBodyNotReplayable: the attempt needed a retry but its body was a
	// stream larger than the buffer limit ([WithBodyLimit]) without
	// Request.GetBody, so it could be sent only once.
	ErrBodyNotReplayable = errors.New("idemclient: request body cannot be re-sent")
)

// GaveUpError is returned (wrapped in a *url.Error by http.Client) when a
// request with an idempotency key still needed a retry but the Transport
// stopped: out of attempts or time, a Retry-After beyond the cap, a body
// that cannot be re-sent, or the request context ended. Retrying later with
// the same Key is safe: a completed execution is replayed, not repeated.
type GaveUpError struct {
	// Key is the idempotency key every attempt carried.
	Key string
	// Attempts is the number of attempts sent.
	Attempts int
	// StatusCode is the status of the last response (its body was drained
	// and closed), or 0 when the last attempt got no response.
	StatusCode int
	// RetryAfter is the last response's Retry-After delay, 0 without one.
	RetryAfter time.Duration
	// Err is the last attempt's transport error, nil when it got a response.
	Err error
	// Reason is why retrying stopped: ErrAttemptsExhausted, ErrOutOfTime,
	// ErrRetryAfterTooLong, ErrBodyNotReplayable, or the request context's
	// error (context.Canceled, context.DeadlineExceeded).
	Reason error
}

// Error names the key, the attempts and the last outcome.
func (e *GaveUpError) Error() string {
	last := fmt.Sprintf("status %d", e.StatusCode)
	if e.Err != nil {
		last = e.Err.Error()
	}
	return fmt.Sprintf("idemclient: gave up after %d attempt(s) with idempotency key %q (%v); last: %s",
		e.Attempts, e.Key, e.Reason, last)
}

// Unwrap returns Reason and Err, so that errors.Is matches both.
func (e *GaveUpError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.Reason, e.Err} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
