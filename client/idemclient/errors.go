package idemclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	idem "github.com/idemkit/idem/core"
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

// ErrResent is the Err of an [Attempt] that net/http's transport re-sent by
// itself on a new connection, its reused keep-alive connection having
// broken before any response byte arrived (golang/go#19943).
var ErrResent = errors.New("idemclient: connection broke before a response; net/http re-sent the request on a new connection")

// Errors an [*OutcomeError] matches with errors.Is, one per answer of idem
// that ends the key's use without a result. None is retried: sending the
// same request again with the same key gets the same answer.
var (
	// ErrUncertain: 409 "operation-uncertain". The request started on a
	// server that stopped before recording its outcome: it may or may not
	// have taken effect. Do not retry; the service's operator resolves the
	// record (cmd/idemctl). Also matches idem.ErrUncertain.
	ErrUncertain = errors.New("idemclient: the outcome of the request with this key is uncertain; do not retry, the service operator must resolve it")
	// ErrKeyExpired: 410 "key-expired". The key was used and its response
	// is no longer stored: check the original request's outcome, use a new
	// key for a new request. Also matches idem.ErrKeyExpired.
	ErrKeyExpired = errors.New("idemclient: the key was used and its response is no longer stored")
	// ErrReplayForbidden: 403 "replay-forbidden". The key was used, and
	// this caller may not see its outcome.
	ErrReplayForbidden = errors.New("idemclient: the key was used and this caller may not see its outcome")
	// ErrKeyReused: 422 "key-reused". The key was used with another request
	// (a client bug). Also matches idem.ErrMismatch.
	ErrKeyReused = errors.New("idemclient: the key was used with another request")
	// ErrFingerprintChanged: 422 "fingerprint-changed". The key's record was
	// made while the service compared requests another way; nothing was
	// executed. Use a new key for a new request.
	ErrFingerprintChanged = errors.New("idemclient: the key's record was made under another request comparison; nothing was executed")
	// ErrStoredResultUnreadable: 500 "stored-result-unreadable". The key's
	// record cannot be read; the operator clears it. Also matches
	// idem.ErrCorrupt.
	ErrStoredResultUnreadable = errors.New("idemclient: the key's stored result is unreadable")
)

// outcomeErrors are the errors of the outcomes returned as an OutcomeError.
var outcomeErrors = map[idem.Outcome]error{
	idem.OutcomeUncertain:          ErrUncertain,
	idem.OutcomeKeyExpired:         ErrKeyExpired,
	idem.OutcomeReplayForbidden:    ErrReplayForbidden,
	idem.OutcomeKeyReused:          ErrKeyReused,
	idem.OutcomeFingerprintChanged: ErrFingerprintChanged,
	idem.OutcomeUnreadable:         ErrStoredResultUnreadable,
}

// OutcomeError is returned (wrapped in a *url.Error by http.Client) when the
// server answered with one of idem's answers that end the key's use without
// a result: operation-uncertain, key-expired, replay-forbidden, key-reused,
// fingerprint-changed or stored-result-unreadable. It is returned at once,
// without a retry, and matches the Err* of its outcome (and core's error
// for it, e.g. idem.ErrUncertain) with errors.Is. The response's body was
// read and closed.
type OutcomeError struct {
	// Key is the idempotency key the request carried.
	Key string
	// Attempts is the number of attempts sent.
	Attempts int
	// StatusCode is the response's status.
	StatusCode int
	// Outcome is idem's answer.
	Outcome idem.Outcome
	// Title and Detail are the problem's (RFC 9457).
	Title, Detail string
}

// Error names the outcome, the key and the server's detail.
func (e *OutcomeError) Error() string {
	return fmt.Sprintf("idemclient: %v (status %d, %s) for idempotency key %q after %d attempt(s): %s",
		outcomeErrors[e.Outcome], e.StatusCode, e.Outcome, e.Key, e.Attempts, e.Detail)
}

// Unwrap returns the outcome's Err* and core's error for it.
func (e *OutcomeError) Unwrap() []error {
	var errs []error
	for _, err := range []error{outcomeErrors[e.Outcome], e.Outcome.Err()} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// newOutcomeError returns the OutcomeError for resp, whose outcome is o,
// or nil when o is not one of them. It reads resp's problem.
func newOutcomeError(key string, attempts int, resp *http.Response, o idem.Outcome) *OutcomeError {
	if outcomeErrors[o] == nil {
		return nil
	}
	var p idem.Problem
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxProblemBytes))
	_ = json.Unmarshal(b, &p)
	return &OutcomeError{Key: key, Attempts: attempts, StatusCode: resp.StatusCode, Outcome: o, Title: p.Title, Detail: p.Detail}
}

// GaveUpError is returned (wrapped in a *url.Error by http.Client) when a
// request with an idempotency key still needed a retry but the Transport
// stopped: out of time or attempts, a Retry-After beyond the cap, a body
// that cannot be re-sent, or the request context ended. The request may
// have been executed. Resuming is safe: send it again later with the same
// Key ([WithKey] on its context, or the Idempotency-Key header), and a
// completed execution is replayed, not repeated; an execution still in
// progress is waited for.
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

// Error names the key, the attempts, the last outcome, and how to resume.
func (e *GaveUpError) Error() string {
	last := fmt.Sprintf("status %d", e.StatusCode)
	if e.Err != nil {
		last = e.Err.Error()
	}
	return fmt.Sprintf("idemclient: gave up after %d attempt(s) with idempotency key %q (%v); last: %s; "+
		"the request may have been executed: resume with the same key, idemclient.WithKey(ctx, %q), to get its answer",
		e.Attempts, e.Key, e.Reason, last, e.Key)
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
