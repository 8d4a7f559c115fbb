package idemclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	idem "github.com/idemkit/idem/core"
)

// HeaderKey is the request header carrying the idempotency key (IETF draft
// "The Idempotency-Key HTTP Header Field" section 2).
const HeaderKey = "Idempotency-Key"

// Defaults of the options.
const (
	// DefaultMaxAttempts bounds the attempts answered 500 when
	// [WithMaxAttempts] is not set: the handler ran and failed (idem
	// released the key), so each retry runs it again, and a handler that
	// always fails is not run for the whole time budget. Other failures are
	// bounded in time only ([WithMaxElapsed]).
	DefaultMaxAttempts = 5
	// DefaultMaxElapsed bounds the whole call's retries in time
	// ([WithMaxElapsed]), whatever made them: a server restarting (refused
	// connections for the seconds a deploy or a process manager takes), or
	// a crashed holder's in-progress record, which answers 409 for up to
	// idem's default lease (idem.DefaultLease, 30s) before a retry takes it
	// over; plus [InProgressMargin] for the takeover's own execution: 1m0s.
	DefaultMaxElapsed = idem.DefaultLease + InProgressMargin
	// InProgressMargin is what [DefaultMaxElapsed] adds to the default
	// lease: the time a takeover's execution may take to answer.
	InProgressMargin = 30 * time.Second
	// DefaultBaseDelay and DefaultMaxDelay are the backoff's first step
	// and cap ([WithBackoff]): a restarted server is found again at most
	// 5s after it listens.
	DefaultBaseDelay = 100 * time.Millisecond
	DefaultMaxDelay  = 5 * time.Second
	// DefaultMaxRetryAfter is the longest Retry-After honoured
	// ([WithMaxRetryAfter]): the default lease, the longest idem asks for.
	DefaultMaxRetryAfter = 30 * time.Second
	// DefaultBodyLimit is the request body buffered to be re-sent, in
	// bytes ([WithBodyLimit]): 1 MiB.
	DefaultBodyLimit = 1 << 20
)

// Transport is an http.RoundTripper that sends one idempotency key per
// logical request and retries it while that is safe. Use it as the
// Transport of an http.Client, or of any SDK that accepts one. It is safe
// for concurrent use.
//
// A request is covered when it carries an Idempotency-Key header, when its
// context has a key from [WithKey], or when its method is one of
// [WithMethods] (POST and PATCH by default); a covered request without a key
// gets a random one (UUID version 7). Other requests go to the base
// transport untouched, once.
//
// Every attempt of a covered request carries the same key and the same body
// bytes. An attempt is retried when [ClassifyError] or [ClassifyResponse]
// says [Retry]; the wait is the response's Retry-After when it has one (up to
// [WithMaxRetryAfter]), else [Backoff]. Retries are budgeted in time, not
// attempts: transport failures (refused, reset, EOF before a response: the
// server is down or restarting), 425, 429, 502, 503, 504 and in-progress answers
// (idem's 409 in-progress problem, or another server's 409: the IETF
// draft's answer to a request whose key is in use) are retried for as long
// as [WithMaxElapsed] (default 1m: the default lease a crashed holder's
// record can take to lapse, plus a margin for the takeover) and the request
// context's deadline allow, so that a call made while the server restarts,
// or after it crashed mid-request, gets the answer of the one execution. A
// 500 (the handler ran and failed) is retried up to [DefaultMaxAttempts]
// times; [WithMaxAttempts] sets a count for every failed attempt instead.
// Retrying stops when a bound is reached or the request context ends, with
// a [*GaveUpError] that carries the key to resume with ([WithKey]). A final response, replayed or not, is returned as
// the server sent it; [Attempts], [Replayed] and [RequestKey] read what
// happened from it. An answer of idem that ends the key's use without a
// result (operation-uncertain, key-expired, replay-forbidden, key-reused,
// fingerprint-changed, stored-result-unreadable) is returned as an
// [*OutcomeError] at once, never retried.
//
// Go's http.Transport treats a request carrying an Idempotency-Key header as
// replayable (golang/go#19943): when a reused keep-alive connection breaks
// before any response byte arrived, it re-sends the request itself, with the
// same key and the body from GetBody (set here whenever the body can be
// re-sent). The Transport sees such re-sends (a new connection obtained
// within one send, observed with net/http/httptrace's GotConn) and counts
// each as an attempt of its own: [Attempts] includes them, the attempt hook
// is called for each (Err [ErrResent]) and they count towards
// [WithMaxAttempts]. A base transport that reports no GotConn hides them.
type Transport struct {
	base          http.RoundTripper
	methods       []string
	maxAttempts   int
	maxElapsed    time.Duration
	baseDelay     time.Duration
	maxDelay      time.Duration
	maxRetryAfter time.Duration
	attemptTO     time.Duration
	bodyLimit     int64
	respBuffer    int64
	hook          func(Attempt)
	fromStep      bool // WithKeyFromContext
}

// WithKeyFromContext makes the [Transport] send, as the idempotency key of
// a request made inside an idem.Step of the calling service's execution,
// the step's derived key (idem.DerivedKey: the same on every run and
// takeover of that execution), so that a chain of idem services stays
// exactly-once with no key plumbing: a takeover that runs the step again
// sends the same key, and the downstream service replays its answer. It
// ranks below a key in the request's header and one set with [WithKey].
// Optional. Default is off (a random key per request).
func WithKeyFromContext() Option { return func(t *Transport) { t.fromStep = true } }

// Option configures a [Transport].
type Option func(*Transport)

// WithBase sets the transport that sends each attempt. Optional. Default is
// http.DefaultTransport.
func WithBase(rt http.RoundTripper) Option { return func(t *Transport) { t.base = rt } }

// WithMethods sets the methods that get a key and retries without the caller
// asking (a request with a key is covered whatever its method). Optional.
// Default is POST and PATCH (PUT and DELETE are idempotent by definition,
// RFC 9110 section 9.2.2).
func WithMethods(methods ...string) Option {
	return func(t *Transport) { t.methods = slices.Clone(methods) }
}

// WithMaxAttempts bounds the failed attempts of one request (a transport
// error, net/http's own re-sends, a retryable status other than 409 in
// progress), the first included, within [WithMaxElapsed]; in-progress
// answers don't count (they are bounded by [WithMaxElapsed] and the
// request's deadline). 1 disables retries altogether, in-progress answers
// included; values below 1 count as 1. Optional. Default is none: failures
// are bounded in time, 500 answers by [DefaultMaxAttempts] (5).
func WithMaxAttempts(n int) Option { return func(t *Transport) { t.maxAttempts = max(n, 1) } }

// WithMaxElapsed bounds the time from the first attempt to the start of the
// last one: no attempt starts later (the request context's deadline, and so
// http.Client.Timeout, bounds it too, whichever ends first). It is the
// budget of every retry: a server restarting refuses connections until it
// listens again, and a takeover after a crash answers once the crashed
// holder's lease lapses, up to the service's lease after the crash. 0
// disables every wait. Optional. Default is [DefaultMaxElapsed] (1m0s:
// idem's default lease 30s plus [InProgressMargin] 30s).
func WithMaxElapsed(d time.Duration) Option { return func(t *Transport) { t.maxElapsed = d } }

// WithBackoff sets the exponential backoff with full jitter used when a
// response has no Retry-After (see [Backoff]): the wait before retry n is
// uniform in [0, min(maxDelay, base·2^(n-1))]. Optional. Default is
// [DefaultBaseDelay] (100ms) and [DefaultMaxDelay] (5s).
func WithBackoff(base, maxDelay time.Duration) Option {
	return func(t *Transport) { t.baseDelay, t.maxDelay = base, maxDelay }
}

// WithMaxRetryAfter caps the Retry-After delay honoured: a longer one ends
// the retries with [ErrRetryAfterTooLong] (the caller can come back later
// with the same key) rather than waiting that long inside one call.
// Optional. Default is [DefaultMaxRetryAfter] (30s).
func WithMaxRetryAfter(d time.Duration) Option { return func(t *Transport) { t.maxRetryAfter = d } }

// WithAttemptTimeout bounds each attempt, from sending it until its response
// headers arrive and its body is closed; an attempt that runs out is retried.
// The request context (and http.Client.Timeout, which bounds the whole call)
// still bounds everything. Optional. Default is 0: attempts are bounded only
// by the request context.
func WithAttemptTimeout(d time.Duration) Option { return func(t *Transport) { t.attemptTO = d } }

// WithBodyLimit sets how many bytes of a request body without
// Request.GetBody are buffered so that it can be re-sent. A longer body is
// streamed once and never retried ([ErrBodyNotReplayable]). Bodies from
// http.NewRequest over bytes, strings and bytes.Buffer have GetBody and are
// never buffered. Optional. Default is [DefaultBodyLimit] (1 MiB).
func WithBodyLimit(n int64) Option { return func(t *Transport) { t.bodyLimit = n } }

// WithResponseBuffer makes RoundTrip read the body of a final response of
// up to n bytes before it returns, so that a reply cut inside its body is
// retried like one cut inside its headers (the key makes that safe) rather
// than failing the caller's read; Attempt.Err then wraps the read error. A
// longer body (by Content-Length, or past n bytes) is returned as a stream,
// its first n bytes already read. Leave it off for streaming responses: the
// read waits for n bytes or the end. Optional. Default is 0: bodies are
// streamed to the caller.
func WithResponseBuffer(n int64) Option { return func(t *Transport) { t.respBuffer = n } }

// WithAttemptHook sets a function called after every attempt of a covered
// request, on the caller's goroutine, before the wait that may follow (for
// logs and metrics), including those net/http's transport re-sent on a new
// connection by itself (reported when its send returns, with Err
// [ErrResent]). It must not keep or close Attempt.Response. Optional.
// Default is none.
func WithAttemptHook(hook func(Attempt)) Option { return func(t *Transport) { t.hook = hook } }

// Attempt describes one attempt of a covered request, for [WithAttemptHook].
type Attempt struct {
	Key      string         // the idempotency key
	N        int            // 1 for the first attempt
	Request  *http.Request  // the request sent
	Response *http.Response // the response, nil when Err is set
	Err      error          // the transport error, nil with a response
	Decision Decision       // Retry when the outcome called for another attempt
	// Wait is the delay before the next attempt, 0 when there is none.
	Wait time.Duration
	// GaveUp is the reason retrying stopped although Decision is Retry.
	GaveUp error
}

// New returns a Transport with the given options.
func New(opts ...Option) *Transport {
	t := &Transport{
		base:          http.DefaultTransport,
		methods:       []string{http.MethodPost, http.MethodPatch},
		maxElapsed:    DefaultMaxElapsed,
		baseDelay:     DefaultBaseDelay,
		maxDelay:      DefaultMaxDelay,
		maxRetryAfter: DefaultMaxRetryAfter,
		bodyLimit:     DefaultBodyLimit,
	}
	for _, o := range opts {
		o(t)
	}
	return t
}

// attemptInfo is stored in the context of every attempt's request, which a
// response carries as Response.Request.
type attemptInfo struct {
	key string
	n   int // set once the attempt's send returned
}

type attemptContextKey struct{}

func infoOf(resp *http.Response) (attemptInfo, bool) {
	if resp == nil || resp.Request == nil {
		return attemptInfo{}, false
	}
	info, ok := resp.Request.Context().Value(attemptContextKey{}).(*attemptInfo)
	if !ok {
		return attemptInfo{}, false
	}
	return *info, true
}

// Attempts returns how many attempts the Transport made for the request resp
// answers (1 when the first attempt was final), re-sends of net/http's
// transport included, or 0 when resp did not come through a Transport's
// covered request.
func Attempts(resp *http.Response) int {
	info, _ := infoOf(resp)
	return info.n
}

// RequestKey returns the idempotency key the request resp answers was sent
// with, or "" when resp did not come through a Transport's covered request.
func RequestKey(resp *http.Response) string {
	info, _ := infoOf(resp)
	return info.key
}

// Replayed reports whether resp is a replay of a stored response
// ("Idempotent-Replayed: true", as idem and Stripe send) rather than the
// answer of an execution made for this call.
func Replayed(resp *http.Response) bool {
	return resp != nil && strings.EqualFold(resp.Header.Get(idem.ReplayedHeader), "true")
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key, covered, err := t.keyFor(req)
	if err != nil || !covered {
		if err != nil {
			closeBody(req)
			return nil, err
		}
		return t.base.RoundTrip(req)
	}
	body, err := newBody(req, t.bodyLimit)
	if err != nil {
		return nil, err
	}
	ctx := req.Context()
	start := time.Now()
	failed := 0    // attempts that count towards maxAttempts
	ranFailed := 0 // attempts answered 500, bounded by DefaultMaxAttempts without WithMaxAttempts
	for n := 1; ; n++ {
		info := &attemptInfo{key: key, n: n}
		var conns atomic.Int32 // connections the send obtained: more than one is a re-send
		actx := httptrace.WithClientTrace(context.WithValue(ctx, attemptContextKey{}, info),
			&httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { conns.Add(1) }})
		attempt := req.Clone(actx)
		if len(attempt.Header.Values(HeaderKey)) == 0 {
			attempt.Header.Set(HeaderKey, key)
		}
		if attempt.Body, attempt.GetBody, err = body.forAttempt(n); err != nil {
			return nil, fmt.Errorf("idemclient: re-reading the request body for attempt %d: %w", n, err)
		}
		attempt, cancel := t.withAttemptTimeout(attempt)
		resp, err := t.base.RoundTrip(attempt)
		for range conns.Load() - 1 { // net/http re-sent the attempt on a new connection
			t.report(Attempt{Key: key, N: n, Request: attempt, Err: ErrResent, Decision: Retry})
			n++
			failed++
		}
		info.n = n
		var decision Decision
		var outcome idem.Outcome
		inProgress := false // never counts towards maxAttempts
		if err == nil {
			decision, outcome = ClassifyResponse(resp)
			inProgress = decision == Retry && resp.StatusCode == http.StatusConflict
			if decision == Retry && resp.StatusCode == http.StatusInternalServerError {
				ranFailed++
			}
			if decision == Stop && t.respBuffer > 0 {
				if err = bufferBody(resp, t.respBuffer); err != nil {
					resp = nil
				}
			}
		}
		if !inProgress {
			failed++
		}

		a := Attempt{Key: key, N: n, Request: attempt, Response: resp, Err: err}
		gaveUp := &GaveUpError{Key: key, Attempts: n, Err: err}
		if err != nil {
			cancel()
			if ctx.Err() != nil { // the caller's context always wins
				a.GaveUp, gaveUp.Reason = ctx.Err(), ctx.Err()
				t.report(a)
				return nil, gaveUp
			}
			a.Decision = ClassifyError(err)
			if a.Decision == Stop {
				t.report(a)
				return nil, err
			}
			a.Wait = Backoff(n, t.baseDelay, t.maxDelay)
		} else {
			a.Decision = decision
			if oe := newOutcomeError(key, n, resp, outcome); oe != nil {
				t.report(a)
				drain(resp.Body)
				cancel()
				return nil, oe
			}
			if a.Decision == Stop {
				resp.Request = attempt
				if t.attemptTO > 0 {
					resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
				} else {
					cancel()
				}
				t.report(a)
				return resp, nil
			}
			gaveUp.StatusCode = resp.StatusCode
			if ra, ok := ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
				gaveUp.RetryAfter, a.Wait = ra, ra
				if ra > t.maxRetryAfter {
					a.GaveUp = ErrRetryAfterTooLong
				}
			} else {
				a.Wait = Backoff(n, t.baseDelay, t.maxDelay)
			}
		}
		switch {
		case a.GaveUp != nil:
		case t.maxAttempts == 1, t.maxAttempts > 1 && !inProgress && failed >= t.maxAttempts,
			t.maxAttempts == 0 && ranFailed >= DefaultMaxAttempts:
			a.GaveUp = ErrAttemptsExhausted
		case !body.replayable():
			a.GaveUp = ErrBodyNotReplayable
		case time.Since(start)+a.Wait > t.maxElapsed:
			a.GaveUp = ErrOutOfTime
		default:
			if d, ok := ctx.Deadline(); ok && time.Until(d) < a.Wait {
				a.GaveUp = ErrOutOfTime
			}
		}
		if a.GaveUp != nil {
			a.Wait = 0
		}
		t.report(a)
		if resp != nil {
			drain(resp.Body)
			cancel()
		}
		if a.GaveUp != nil {
			gaveUp.Reason = a.GaveUp
			return nil, gaveUp
		}
		if err := sleep(ctx, a.Wait); err != nil {
			gaveUp.Reason = err
			return nil, gaveUp
		}
	}
}

// withAttemptTimeout bounds attempt by WithAttemptTimeout, if set; the
// returned function ends the bound.
func (t *Transport) withAttemptTimeout(attempt *http.Request) (*http.Request, context.CancelFunc) {
	if t.attemptTO <= 0 {
		return attempt, func() {}
	}
	ctx, cancel := context.WithTimeout(attempt.Context(), t.attemptTO)
	return attempt.WithContext(ctx), cancel
}

// CloseIdleConnections closes the idle connections of the base transport,
// if it has such a method (http.Client.CloseIdleConnections calls it).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t *Transport) report(a Attempt) {
	if t.hook != nil {
		t.hook(a)
	}
}

// keyFor returns the key of req, and whether req is covered.
func (t *Transport) keyFor(req *http.Request) (string, bool, error) {
	if vs := req.Header.Values(HeaderKey); len(vs) > 0 {
		key, err := idem.ParseKey(vs)
		if err != nil {
			return "", false, errors.Join(errors.New("idemclient: the request's Idempotency-Key header"), err)
		}
		return key, true, nil
	}
	if key, ok := req.Context().Value(keyContextKey{}).(string); ok {
		return key, true, checkKey(key)
	}
	if t.fromStep {
		if key, ok := idem.DerivedKey(req.Context()); ok {
			return key, true, nil
		}
	}
	if !slices.Contains(t.methods, req.Method) {
		return "", false, nil
	}
	key, err := newKey()
	return key, true, err
}

// sleep waits d or until ctx ends, and returns ctx's error in that case.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drain reads a little of a response body that will not be used, so that
// its connection can be reused, and closes it.
func drain(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	_ = body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// bufferBody reads resp's body into memory when it is at most n bytes; a
// read error closes it and is returned.
func bufferBody(resp *http.Response, n int64) error {
	if resp.Body == nil || resp.Body == http.NoBody || resp.ContentLength > n {
		return nil
	}
	buf, err := io.ReadAll(io.LimitReader(resp.Body, n+1))
	if err != nil {
		_ = resp.Body.Close()
		return fmt.Errorf("idemclient: reading the response body: %w", err)
	}
	if int64(len(buf)) > n {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), resp.Body), resp.Body}
		return nil
	}
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(buf))
	return nil
}

// cancelBody ends an attempt's timeout context when its body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// body hands each attempt the same request body bytes.
type body struct {
	first   io.ReadCloser
	getBody func() (io.ReadCloser, error) // nil: the body can be sent once only
}

// newBody prepares req's body for several attempts: no body, Request.GetBody,
// or the body read into memory when it is at most limit bytes; a longer one
// is kept as a stream, sent once.
func newBody(req *http.Request, limit int64) (*body, error) {
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		return &body{first: req.Body, getBody: func() (io.ReadCloser, error) { return req.Body, nil }}, nil
	case req.GetBody != nil:
		return &body{first: req.Body, getBody: req.GetBody}, nil
	}
	buf, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		_ = req.Body.Close()
		return nil, err
	}
	if int64(len(buf)) > limit {
		return &body{first: struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), req.Body), req.Body}}, nil
	}
	_ = req.Body.Close()
	get := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	return &body{first: io.NopCloser(bytes.NewReader(buf)), getBody: get}, nil
}

func (b *body) replayable() bool { return b.getBody != nil }

// forAttempt returns the Body and GetBody of attempt n.
func (b *body) forAttempt(n int) (io.ReadCloser, func() (io.ReadCloser, error), error) {
	if n == 1 {
		return b.first, b.getBody, nil
	}
	rc, err := b.getBody()
	return rc, b.getBody, err
}
