package idemclient

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"
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

func (d Decision) String() string {
	if d == Retry {
		return "retry"
	}
	return "stop"
}

// ClassifyStatus returns the decision for an HTTP response status of a
// request carrying an idempotency key:
//
//	Retry: 409 (idem: a request with this key is in progress), 429 (rate
//	       limited), 500 (idem releases the key on 5xx, so a retry executes
//	       again only when nothing was stored), 502, 503 (idem: store
//	       unavailable), 504.
//	Stop:  everything else: 1xx-3xx, 400, 401, 403, 404, 410, 413, 422 (the
//	       key reused with another payload: a client bug to surface) and
//	       every other 4xx and 5xx (501, 505, ... will not change on a retry).
func ClassifyStatus(status int) Decision {
	switch status {
	case http.StatusConflict, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return Retry
	}
	return Stop
}

// ClassifyError returns the decision for an error a transport returned
// instead of a response, once the caller's own context is known to be live
// (a cancelled or expired request context always stops; the caller checks
// it, not this function):
//
//	Retry: connection refused, reset or aborted, a broken pipe, io.EOF and
//	       io.ErrUnexpectedEOF (the connection closed before a complete
//	       response), timeouts (net.Error.Timeout, context.DeadlineExceeded
//	       of a per-attempt timeout), and any other *net.OpError (dial and
//	       read failures).
//	Stop:  everything else, e.g. TLS certificate errors, an unsupported URL
//	       scheme, a malformed request.
func ClassifyError(err error) Decision {
	if err == nil {
		return Stop
	}
	var ne net.Error
	var op *net.OpError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout(),
		errors.As(err, &op):
		return Retry
	}
	return Stop
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
