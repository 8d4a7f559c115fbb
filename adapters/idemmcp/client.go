package idemmcp

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Client calls tools the way an agent runtime should: each logical call
// gets one idempotency key, generated once and sent in _meta[MetaKey] with
// every attempt, and attempts that may not have been answered (a timeout,
// a cut connection, a server that refuses connections while it restarts,
// an in-progress or store-unavailable answer) are sent again with that
// same key, for up to [WithMaxElapsed] (1 min), so that the server
// executes the call at most once and the retry gets its stored result.
// Safe for concurrent use.
type Client struct {
	connect func(ctx context.Context) (*mcp.ClientSession, error)
	cfg     clientConfig

	mu      sync.Mutex
	session *mcp.ClientSession
	closing sync.WaitGroup // dropped sessions being closed
}

// ClientOption configures a [Client].
type ClientOption func(*clientConfig)

type clientConfig struct {
	attempts       int // 0: no count
	maxElapsed     time.Duration
	attemptTimeout time.Duration
	first, max     time.Duration
	onRetry        func(attempt int, err error, delay time.Duration)
}

// WithAttempts sets how many attempts of one logical call may fail (a
// timeout, a connection error, a store-unavailable answer), the first
// included, within [WithMaxElapsed]. In-progress answers do not count; 1
// disables retries altogether. Optional. Default is none: the time bounds
// the retries. Values below 1 count as 1.
func WithAttempts(n int) ClientOption { return func(c *clientConfig) { c.attempts = max(n, 1) } }

// DefaultMaxElapsed is how long a logical call keeps retrying by default
// ([WithMaxElapsed]): the engine's default lease (idem.DefaultLease, 30s),
// which is how long a crashed holder's record can answer in progress
// before a retry takes it over, plus [InProgressMargin] for the takeover's
// execution: 1m0s. It covers a server restarting too (a deploy, a process
// manager's restart: seconds of refused connections).
const DefaultMaxElapsed = idem.DefaultLease + InProgressMargin

// InProgressMargin is what [DefaultMaxElapsed] adds to the engine's
// default lease: the time a takeover's execution may take to answer.
const InProgressMargin = 30 * time.Second

// WithMaxElapsed bounds the time, from the call's first attempt, spent
// retrying: connection errors and timeouts (after the backoff) and
// in-progress and store-unavailable answers (after their
// RetryAfterSeconds); ctx's deadline bounds it too, whichever ends first.
// Optional. Default is [DefaultMaxElapsed] (1m0s).
func WithMaxElapsed(d time.Duration) ClientOption {
	return func(c *clientConfig) { c.maxElapsed = d }
}

// WithAttemptTimeout bounds each attempt; an attempt that times out is
// sent again with the same key (the server may have executed it).
// Optional. Default is 30s.
func WithAttemptTimeout(d time.Duration) ClientOption {
	return func(c *clientConfig) { c.attemptTimeout = d }
}

// WithBackoff sets the delay before the second attempt after a timeout or
// connection error, doubled at each attempt up to maxDelay, drawn from its
// upper half (jitter). Answers with ErrorData.RetryAfterSeconds wait that
// long instead. Optional. Default is 200ms and 5s.
func WithBackoff(first, maxDelay time.Duration) ClientOption {
	return func(c *clientConfig) { c.first, c.max = first, maxDelay }
}

// WithRetryHook sets a function called before each retry with the number
// of the attempt that failed (from 1), its error and the delay before the
// next one, e.g. to log it. Optional. Default is none.
func WithRetryHook(fn func(attempt int, err error, delay time.Duration)) ClientOption {
	return func(c *clientConfig) { c.onRetry = fn }
}

// NewClient returns a Client whose sessions come from connect, e.g.
// client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil).
// It calls connect on the first call, and again after an attempt fails
// with a connection error (the session is then closed and replaced).
func NewClient(connect func(ctx context.Context) (*mcp.ClientSession, error), opts ...ClientOption) *Client {
	c := &Client{connect: connect, cfg: clientConfig{maxElapsed: DefaultMaxElapsed, attemptTimeout: 30 * time.Second, first: 200 * time.Millisecond, max: 5 * time.Second}}
	for _, o := range opts {
		o(&c.cfg)
	}
	return c
}

// NewKey returns a fresh idempotency key: 26 characters of base32 from
// crypto/rand (128 bits).
func NewKey() string { return crand.Text() }

// CallTool runs one logical tool call. params is not modified: each
// attempt sends a copy whose _meta[MetaKey] holds params' own key when it
// has one (a key the runtime journals to survive its own restart; sent as
// it is, so the server refuses a malformed one), else a key from [NewKey]
// made once for this call.
//
// It returns the first answer that is final: a result (the tool's, or the
// stored one replayed, marked with _meta[ReplayedMetaKey]), or an error
// that retrying with the same key cannot change (a JSON-RPC error other
// than an in-progress or store-unavailable one: [ErrorDataOf] reads it; an
// HTTP 4xx other than 404 session-missing, 408, 409, 425 and 429; a
// failure idem.RetryCannotFix names: a DNS name not found, a TLS
// certificate refused). Retries are budgeted in time ([WithMaxElapsed],
// ctx's deadline): a call made while its server restarts (initialize
// refused) or after it crashed mid-call waits until the server is back and
// the crashed holder's lease lapsed, and a retry takes the execution over.
// [WithAttempts] adds a count. When a bound is reached, or ctx ends, it
// returns a [*GaveUpError] wrapping the last error (or ctx's), with the
// key to resume with. Errors of an attempt that may have reached the
// server are never retried with another key.
func (c *Client) CallTool(ctx context.Context, params *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	p := *params
	p.Meta = maps.Clone(params.Meta)
	if p.Meta == nil {
		p.Meta = mcp.Meta{}
	}
	if k, ok := p.Meta[MetaKey]; !ok || k == nil {
		p.Meta[MetaKey] = NewKey()
	}
	key, _ := p.Meta[MetaKey].(string)
	next := c.cfg.first
	start := time.Now()
	failed := 0 // attempts that count towards cfg.attempts
	for attempt := 1; ; attempt++ {
		res, err := c.attempt(ctx, &p)
		if err == nil {
			return res, nil
		}
		gaveUp := func(reason error) error {
			return &GaveUpError{Key: key, Attempts: attempt, Elapsed: time.Since(start), Reason: reason, Err: err}
		}
		if ctx.Err() != nil {
			return nil, gaveUp(ctx.Err())
		}
		delay, retry, inProgress := time.Duration(0), false, false
		if d, ok := ErrorDataOf(err); ok {
			retry, delay = d.Retryable, time.Duration(d.RetryAfterSeconds)*time.Second
			inProgress = d.Type == TypeInProgress
		} else if !isProtocolError(err) && !idem.RetryCannotFix(err) && !httpRefusal(err) { // timeout, connection error
			retry = true
			delay = next/2 + rand.N(next/2+1) //nolint:gosec // jitter, not a secret
			next = min(2*next, c.cfg.max)
		}
		if !inProgress {
			failed++
		}
		switch {
		case !retry:
			return nil, err
		case c.cfg.attempts == 1, c.cfg.attempts > 1 && !inProgress && failed >= c.cfg.attempts:
			return nil, gaveUp(ErrAttemptsExhausted)
		case time.Since(start)+delay > c.cfg.maxElapsed:
			return nil, gaveUp(ErrOutOfTime)
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < delay {
			return nil, gaveUp(ErrOutOfTime)
		}
		if c.cfg.onRetry != nil {
			c.cfg.onRetry(attempt, err, delay)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, gaveUp(ctx.Err())
		case <-t.C:
		}
	}
}

// Reasons [Client.CallTool] stopped retrying a call that still needed a
// retry, carried by [GaveUpError.Reason].
var (
	// ErrOutOfTime: the next attempt would start after [WithMaxElapsed]
	// or ctx's deadline.
	ErrOutOfTime = errors.New("idemmcp: no time left for another attempt")
	// ErrAttemptsExhausted: the last attempt [WithAttempts] allows failed.
	ErrAttemptsExhausted = errors.New("idemmcp: attempts exhausted")
)

// GaveUpError is the error of [Client.CallTool] when it stopped retrying a
// call whose last error was retryable: the call may have been executed.
// Resuming is safe: call again later with the same Key in
// _meta[MetaKey], and a completed execution is replayed, not repeated.
// It wraps the last attempt's error ([ErrorDataOf] reads it) and the
// reason.
type GaveUpError struct {
	// Key is the idempotency key every attempt carried in _meta[MetaKey].
	Key string
	// Attempts is the number of attempts; Elapsed the time from the first.
	Attempts int
	Elapsed  time.Duration
	// Reason is why retrying stopped: [ErrOutOfTime],
	// [ErrAttemptsExhausted] or ctx's error.
	Reason error
	// Err is the last attempt's error.
	Err error
}

// Error names the key, the attempts, the last error and how to resume.
func (e *GaveUpError) Error() string {
	return fmt.Sprintf("idemmcp: gave up after %d attempt(s) in %v with idempotency key %q (%v): the call may have been executed; "+
		"resume by calling again with _meta[%q] = %q to get its answer; last: %v",
		e.Attempts, e.Elapsed.Round(time.Millisecond), e.Key, e.Reason, MetaKey, e.Key, e.Err)
}

// Unwrap returns the last attempt's error and the reason.
func (e *GaveUpError) Unwrap() []error { return []error{e.Err, e.Reason} }

// httpRefusal reports whether err is the streamable HTTP transport's
// report of a 4xx status a retry cannot change (the go-sdk gives it as
// "...: <status text>"): every 4xx but 408, 409, 425 and 429, and a 404
// for a session the server no longer knows (mcp.ErrSessionMissing: the
// client connects again).
func httpRefusal(err error) bool {
	if errors.Is(err, mcp.ErrSessionMissing) {
		return false
	}
	msg := err.Error()
	for code := 400; code < 500; code++ {
		switch code {
		case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
			continue
		}
		if text := http.StatusText(code); text != "" && strings.HasSuffix(msg, ": "+text) {
			return true
		}
	}
	return false
}

// attempt sends p once on the current session (connecting first when
// there is none); after a connection error it drops the session.
func (c *Client) attempt(ctx context.Context, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	s, err := c.current(ctx)
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, c.cfg.attemptTimeout)
	defer cancel()
	// CallTool fills in nil arguments; give it its own copy of p.
	cp := *p
	res, err := s.CallTool(actx, &cp)
	if err != nil && !isProtocolError(err) && !errors.Is(err, context.DeadlineExceeded) {
		c.drop(s) // the session's connection failed: the next attempt connects again
	}
	return res, err
}

// current returns the session, connecting when there is none.
func (c *Client) current(ctx context.Context) (*mcp.ClientSession, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.session != nil {
		return c.session, nil
	}
	actx, cancel := context.WithTimeout(ctx, c.cfg.attemptTimeout)
	defer cancel()
	s, err := c.connect(actx)
	if err != nil {
		return nil, err
	}
	c.session = s
	return s, nil
}

// drop forgets s, unless another call replaced it already, and closes it
// in the background: closing a streamable HTTP session waits for the
// server's answer to its DELETE, which may wait for the very call being
// retried.
func (c *Client) drop(s *mcp.ClientSession) {
	c.mu.Lock()
	if c.session == s {
		c.session = nil
	}
	c.mu.Unlock()
	c.closing.Go(func() { _ = s.Close() })
}

// Close closes the current session, if any, and waits for the sessions
// dropped after connection errors to be closed.
func (c *Client) Close() error {
	c.mu.Lock()
	s := c.session
	c.session = nil
	c.mu.Unlock()
	var err error
	if s != nil {
		err = s.Close()
	}
	c.closing.Wait()
	return err
}

// The go-sdk's own JSON-RPC error codes for calls that got no answer from
// the server (its internal/jsonrpc2 package): the transport rejected the
// request or lost its response (ErrRejected), or a side of the session is
// closing (ErrClientClosing, ErrServerClosing).
const (
	codeRejected      = -32005
	codeClientClosing = -32003
	codeServerClosing = -32004
)

// isProtocolError reports whether err is a JSON-RPC error answered by the
// server: the request arrived and was answered, so the connection is fine
// and the answer is final unless its ErrorData says otherwise.
func isProtocolError(err error) bool {
	var we *jsonrpc.Error
	if !errors.As(err, &we) {
		return false
	}
	switch we.Code {
	case codeRejected, codeClientClosing, codeServerClosing:
		return false
	}
	return true
}
