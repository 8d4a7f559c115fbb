package idemmcp

import (
	"context"
	crand "crypto/rand"
	"errors"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Client calls tools the way an agent runtime should: each logical call
// gets one idempotency key, generated once and sent in _meta[MetaKey] with
// every attempt, and attempts that may not have been answered (a timeout,
// a cut connection, an in-progress or store-unavailable answer) are sent
// again with that same key, so that the server executes the call at most
// once and the retry gets its stored result. Safe for concurrent use.
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
	attempts       int
	inProgressWait time.Duration
	attemptTimeout time.Duration
	first, max     time.Duration
	onRetry        func(attempt int, err error, delay time.Duration)
}

// WithAttempts sets how many attempts of one logical call may fail (a
// timeout, a connection error, a store-unavailable answer), the first
// included. In-progress answers do not count (see [WithInProgressWait]);
// 1 disables retries altogether. Optional. Default is [DefaultAttempts]
// (5). Values below 1 count as 1.
func WithAttempts(n int) ClientOption { return func(c *clientConfig) { c.attempts = max(n, 1) } }

// DefaultAttempts is how many attempts of one logical call may fail by
// default ([WithAttempts]).
const DefaultAttempts = 5

// DefaultInProgressWait is how long a logical call keeps retrying
// in-progress answers ([TypeInProgress]) by default: the engine's default
// lease (idem.DefaultLease, 30s), which is how long a crashed holder's
// record can answer in progress before a retry takes it over, plus
// [InProgressMargin] for the takeover's execution: 1m0s.
const DefaultInProgressWait = idem.DefaultLease + InProgressMargin

// InProgressMargin is what [DefaultInProgressWait] adds to the engine's
// default lease: the time a takeover's execution may take to answer.
const InProgressMargin = 30 * time.Second

// WithInProgressWait bounds the time, from the call's first attempt, spent
// retrying in-progress answers, each after its RetryAfterSeconds; ctx's
// deadline bounds it too, whichever ends first. Optional. Default is
// [DefaultInProgressWait] (1m0s).
func WithInProgressWait(d time.Duration) ClientOption {
	return func(c *clientConfig) { c.inProgressWait = d }
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
	c := &Client{connect: connect, cfg: clientConfig{attempts: DefaultAttempts, inProgressWait: DefaultInProgressWait, attemptTimeout: 30 * time.Second, first: 200 * time.Millisecond, max: 5 * time.Second}}
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
// than an in-progress or store-unavailable one: [ErrorDataOf] reads it).
// In-progress answers are budgeted in time ([WithInProgressWait], ctx's
// deadline), failed attempts in number ([WithAttempts]): a call retried
// after its server crashed waits until the crashed holder's lease lapses
// and a retry takes the execution over. When a bound is reached it returns
// the last error; when ctx ends, ctx's error. Errors of an attempt that may have reached the server are never
// retried with another key.
func (c *Client) CallTool(ctx context.Context, params *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	p := *params
	p.Meta = maps.Clone(params.Meta)
	if p.Meta == nil {
		p.Meta = mcp.Meta{}
	}
	if k, ok := p.Meta[MetaKey]; !ok || k == nil {
		p.Meta[MetaKey] = NewKey()
	}
	next := c.cfg.first
	start := time.Now()
	failed := 0 // attempts that count towards cfg.attempts
	var last error
	for attempt := 1; ; attempt++ {
		res, err := c.attempt(ctx, &p)
		if err == nil {
			return res, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		last = err
		delay, retry, inProgress := time.Duration(0), false, false
		if d, ok := ErrorDataOf(err); ok {
			retry, delay = d.Retryable, time.Duration(d.RetryAfterSeconds)*time.Second
			inProgress = d.Type == TypeInProgress
		} else if !isProtocolError(err) { // timeout, connection error
			retry = true
			delay = next/2 + rand.N(next/2+1) //nolint:gosec // jitter, not a secret
			next = min(2*next, c.cfg.max)
		}
		if !inProgress {
			failed++
		}
		switch {
		case !retry, c.cfg.attempts <= 1, failed >= c.cfg.attempts:
			return nil, last
		case inProgress && time.Since(start)+delay > c.cfg.inProgressWait:
			return nil, last
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < delay {
			return nil, last
		}
		if c.cfg.onRetry != nil {
			c.cfg.onRetry(attempt, err, delay)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
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
