package idemclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
)

// Decision is what a client does with the outcome of one attempt of a
// request that carries an idempotency key. It does not depend on HTTP, so
// that other transports (a gRPC interceptor mapping its own codes) share the
// same vocabulary.
type Decision int

const (
	// Stop: the outcome is final. It is returned to the caller as it is.
	Stop Decision = iota
	// Retry: the outcome says nothing was decided for good (the request may
	// not have arrived, its answer was lost, or the server asked for a later
	// attempt); re-sending it with the same key is safe.
	Retry
)

// String returns the decision's name, for logs.
func (d Decision) String() string {
	if d == Retry {
		return "retry"
	}
	return "stop"
}

// ClassifyStatus returns the decision for an HTTP response status of a
// request carrying an idempotency key:
//
//	Retry: 409 (idem: a request with this key is in progress), 425 (too
//	       early, RFC 8470: sent again after the TLS handshake), 429 (rate
//	       limited), 500 (idem releases the key on 5xx, so a retry executes
//	       again only when nothing was stored), 502, 503 (idem: store
//	       unavailable), 504.
//	Stop:  everything else: 1xx-3xx, 400, 401, 403, 404, 410, 413, 422 (the
//	       key reused with another payload: a client bug to surface) and
//	       every other 4xx and 5xx (501, 505, ... will not change on a retry).
func ClassifyStatus(status int) Decision {
	switch status {
	case http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return Retry
	}
	return Stop
}

// ClassifyResponse returns the decision for a response to a request
// carrying an idempotency key, and the outcome it reports when it is one of
// idem's answers (an RFC 9457 problem whose type is one of the README's
// behaviour table, [idem.OutcomeOfType]; idem.OutcomeNone otherwise). An
// answer of idem is decided by its outcome: Retry for in-progress and
// store-unavailable only ([idem.Outcome.Retryable]), so a 409
// operation-uncertain, a 410 key-expired, a 403 replay-forbidden, a 422
// key-reused or fingerprint-changed and a 500 stored-result-unreadable stop
// at once. Any other response is decided by [ClassifyStatus]. To read the
// problem type it reads up to 64 KiB of a problem+json body with one of
// idem's statuses, and puts the bytes back in front of resp.Body.
func ClassifyResponse(resp *http.Response) (Decision, idem.Outcome) {
	if o := problemOutcome(resp); o != idem.OutcomeNone {
		if o.Retryable() {
			return Retry, o
		}
		return Stop, o
	}
	return ClassifyStatus(resp.StatusCode), idem.OutcomeNone
}

// maxProblemBytes bounds the body read to find a problem's type.
const maxProblemBytes = 64 << 10

// problemOutcome returns the outcome of an idem problem response, reading
// its body into memory (put back in front of resp.Body).
func problemOutcome(resp *http.Response) idem.Outcome {
	if resp.Body == nil || resp.Body == http.NoBody || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		return idem.OutcomeNone
	}
	switch resp.StatusCode {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusConflict, http.StatusGone,
		http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity, http.StatusInternalServerError, http.StatusServiceUnavailable:
	default:
		return idem.OutcomeNone
	}
	buf, err := io.ReadAll(io.LimitReader(resp.Body, maxProblemBytes))
	rest := resp.Body
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf), rest), rest}
	if err != nil {
		return idem.OutcomeNone
	}
	var p idem.Problem
	if json.Unmarshal(buf, &p) != nil {
		return idem.OutcomeNone
	}
	return idem.OutcomeOfType(p.Type)
}

// ClassifyError returns the decision for an error a transport returned
// instead of a response, once the caller's own context is known to be live
// (a cancelled or expired request context always stops; the caller checks
// it, not this function).
//
// Any failure to get a complete response that a restarted or reachable
// again server fixes is retried: connection refused, reset or aborted,
// io.EOF and io.ErrUnexpectedEOF (closed before a complete response), a
// response cut inside its status line or headers (net/http: "transport
// connection broken"), timeouts, temporary DNS failures. The request may
// have been executed, but the key makes a re-send safe. Errors a re-send
// cannot cure stop ([idem.RetryCannotFix], as in go-retryablehttp's default
// policy): context.Canceled, a DNS name not found, TLS certificate and
// handshake-record errors, and the request errors net/http reports for an
// unsupported URL scheme, a URL without host, or an invalid header field.
func ClassifyError(err error) Decision {
	if err == nil || errors.Is(err, context.Canceled) || idem.RetryCannotFix(err) {
		return Stop
	}
	return Retry
}

// ParseRetryAfter returns the delay a Retry-After header value asks for
// (RFC 9110 section 10.2.3): delta-seconds ("120") or an HTTP-date, relative
// to now (a date in the past is 0). ok is false for an empty or malformed
// value.
func ParseRetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	if value == "" {
		return 0, false
	}
	if s, err := strconv.ParseUint(value, 10, 32); err == nil {
		return time.Duration(s) * time.Second, true
	}
	t, err := http.ParseTime(value)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// Backoff returns the delay before retry number retry (1 for the first
// retry) with exponential backoff and full jitter (AWS Architecture Blog,
// "Exponential Backoff And Jitter"): uniform in [0, min(maxDelay,
// base·2^(retry-1))].
func Backoff(retry int, base, maxDelay time.Duration) time.Duration {
	d := base
	for i := 1; i < retry && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1) //nolint:gosec // jitter, not a secret
}
