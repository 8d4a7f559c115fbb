package idemclient_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/client/idemclient"
	idem "github.com/idemkit/idem/core"
)

// seen is one request a test server received.
type seen struct {
	method string
	keys   []string
	body   string
}

// script is a test server that answers the n-th request (from 0) with
// answer(n, w, r) and records every request.
type script struct {
	t      *testing.T
	srv    *httptest.Server
	answer func(n int, w http.ResponseWriter, r *http.Request)
	mu     sync.Mutex
	got    []seen
}

func newScript(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *script {
	t.Helper()
	s := &script{t: t, answer: answer}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return // the client went away mid-body
		}
		s.mu.Lock()
		n := len(s.got)
		s.got = append(s.got, seen{method: r.Method, keys: r.Header.Values("Idempotency-Key"), body: string(b)})
		s.mu.Unlock()
		s.answer(n, w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *script) requests() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.got...)
}

// statuses answers the n-th request with codes[n], the last one after that.
func statuses(codes ...int) func(int, http.ResponseWriter, *http.Request) {
	return func(n int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(codes[min(n, len(codes)-1)])
	}
}

// fast is the options of tests that don't look at waits.
func fast(opts ...idemclient.Option) []idemclient.Option {
	return append([]idemclient.Option{idemclient.WithBackoff(time.Millisecond, time.Millisecond)}, opts...)
}

func client(opts ...idemclient.Option) *http.Client {
	base := &http.Transport{}
	return &http.Client{Transport: idemclient.New(append([]idemclient.Option{idemclient.WithBase(base)}, opts...)...)}
}

func post(t *testing.T, c *http.Client, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return c.Do(req)
}

func closeIdle(c *http.Client) { c.CloseIdleConnections() }

// TestEveryStatus sends a POST whose first answer is each status from 200 to
// 599 and whose second is 201: retried statuses take two attempts, the
// others are returned as they are after one.
func TestEveryStatus(t *testing.T) {
	var status int
	s := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Second") == "" && n%2 == 0 {
			w.WriteHeader(status)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	c := client(fast()...)
	defer closeIdle(c)
	for status = 200; status <= 599; status++ {
		before := len(s.requests())
		// Keep the server's parity in step: a stop uses one request, a retry two.
		resp, err := post(t, c, s.srv.URL, "{}")
		if err != nil {
			t.Fatalf("%d: %v", status, err)
		}
		_ = resp.Body.Close()
		sent := len(s.requests()) - before
		if retried[status] {
			if resp.StatusCode != http.StatusCreated || idemclient.Attempts(resp) != 2 || sent != 2 {
				t.Errorf("%d: final %d after %d attempts (%d sent), want 201 after 2", status, resp.StatusCode, idemclient.Attempts(resp), sent)
			}
		} else {
			if resp.StatusCode != status || idemclient.Attempts(resp) != 1 || sent != 1 {
				t.Errorf("%d: final %d after %d attempts (%d sent), want %d after 1", status, resp.StatusCode, idemclient.Attempts(resp), sent, status)
			}
			// Realign: the server answers the next request with the first status again.
			if sent == 1 {
				req, _ := http.NewRequest(http.MethodGet, s.srv.URL, nil)
				req.Header.Set("X-Second", "1")
				if r, err := c.Do(req); err == nil {
					_ = r.Body.Close()
				}
			}
		}
	}
}

// TestOneKeyEveryAttempt: every attempt of one logical request carries the
// same key (a UUIDv7 when the caller gave none) and the same body bytes.
func TestOneKeyEveryAttempt(t *testing.T) {
	s := newScript(t, statuses(503, 502, 409, 201))
	var hooked []idemclient.Attempt
	c := client(fast(idemclient.WithAttemptHook(func(a idemclient.Attempt) { hooked = append(hooked, a) }))...)
	defer closeIdle(c)
	resp, err := post(t, c, s.srv.URL, `{"amount":1999}`)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	got := s.requests()
	if len(got) != 4 || idemclient.Attempts(resp) != 4 || resp.StatusCode != 201 {
		t.Fatalf("%d requests, Attempts %d, status %d; want 4, 4, 201", len(got), idemclient.Attempts(resp), resp.StatusCode)
	}
	key := idemclient.RequestKey(resp)
	u, err := uuid.Parse(key)
	if err != nil || u.Version() != 7 {
		t.Errorf("generated key %q: %v, version %v; want a UUIDv7", key, err, u.Version())
	}
	for i, r := range got {
		if len(r.keys) != 1 || r.keys[0] != key || r.body != `{"amount":1999}` {
			t.Errorf("attempt %d: keys %q body %q; want [%s] and the same body", i+1, r.keys, r.body, key)
		}
	}
	if len(hooked) != 4 {
		t.Fatalf("hook saw %d attempts", len(hooked))
	}
	for i, a := range hooked {
		wantDecision := idemclient.Retry
		if i == 3 {
			wantDecision = idemclient.Stop
		}
		if a.N != i+1 || a.Key != key || a.Decision != wantDecision || a.Response == nil || a.Err != nil || a.GaveUp != nil {
			t.Errorf("hook %d: %+v", i+1, a)
		}
	}
	// Two logical requests get two keys.
	resp2, err := post(t, c, s.srv.URL, `{}`)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp2.Body.Close()
	if idemclient.RequestKey(resp2) == key {
		t.Error("two logical requests shared a key")
	}
}

// TestCallerKeys: a key in the header or from WithKey is the one sent; a
// malformed one is an error and nothing is sent; methods outside the
// covered ones get neither key nor retries unless the caller gave a key.
func TestCallerKeys(t *testing.T) {
	s := newScript(t, statuses(503, 201))
	c := client(fast()...)
	defer closeIdle(c)
	do := func(req *http.Request) *http.Response {
		t.Helper()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	last := func() seen { got := s.requests(); return got[len(got)-1] }

	req, _ := http.NewRequest(http.MethodPost, s.srv.URL, strings.NewReader("a"))
	req.Header.Set("Idempotency-Key", `"order-1"`) // the draft's sf-string form is kept as sent
	if resp := do(req); resp.StatusCode != 201 || idemclient.RequestKey(resp) != "order-1" || last().keys[0] != `"order-1"` {
		t.Errorf("header key: status %d key %q sent %q", resp.StatusCode, idemclient.RequestKey(resp), last().keys)
	}
	if req.Header.Get("Idempotency-Key") != `"order-1"` || len(req.Header.Values("Idempotency-Key")) != 1 {
		t.Error("the caller's request was modified")
	}

	s.answer = statuses(201)
	req, _ = http.NewRequestWithContext(idemclient.WithKey(context.Background(), "order-2"), http.MethodPut, s.srv.URL, strings.NewReader("b"))
	if resp := do(req); idemclient.RequestKey(resp) != "order-2" || last().keys[0] != "order-2" || last().method != http.MethodPut {
		t.Errorf("WithKey on PUT: key %q sent %q", idemclient.RequestKey(resp), last().keys)
	}
	if req.Header.Get("Idempotency-Key") != "" {
		t.Error("WithKey modified the caller's request")
	}

	n := len(s.requests())
	for _, bad := range []func() *http.Request{
		func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, s.srv.URL, nil)
			r.Header.Set("Idempotency-Key", "two words")
			return r
		},
		func() *http.Request {
			r, _ := http.NewRequestWithContext(idemclient.WithKey(context.Background(), strings.Repeat("k", 256)), http.MethodPost, s.srv.URL, nil)
			return r
		},
		func() *http.Request {
			r, _ := http.NewRequestWithContext(idemclient.WithKey(context.Background(), ""), http.MethodPost, s.srv.URL, nil)
			return r
		},
	} {
		resp, err := c.Do(bad())
		if err == nil {
			_ = resp.Body.Close()
			t.Error("malformed key sent")
		} else if !errors.Is(err, idem.ErrKeyMalformed) && !errors.Is(err, idem.ErrKeyTooLong) {
			t.Errorf("malformed key: %v", err)
		}
	}
	if len(s.requests()) != n {
		t.Error("a request with a malformed key reached the server")
	}

	// GET and DELETE without a key: no key, no retry.
	s.answer = statuses(503)
	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		req, _ = http.NewRequest(m, s.srv.URL, nil)
		if resp := do(req); resp.StatusCode != 503 || idemclient.Attempts(resp) != 0 || len(last().keys) != 0 {
			t.Errorf("%s: status %d attempts %d keys %q; want the 503 untouched", m, resp.StatusCode, idemclient.Attempts(resp), last().keys)
		}
	}
	// WithMethods replaces the covered set.
	c2 := client(fast(idemclient.WithMethods(http.MethodPost, http.MethodDelete), idemclient.WithMaxAttempts(2))...)
	defer closeIdle(c2)
	req, _ = http.NewRequest(http.MethodDelete, s.srv.URL, nil)
	if _, err := c2.Do(req); !errors.Is(err, idemclient.ErrAttemptsExhausted) || len(last().keys) != 1 { //nolint:bodyclose // no response
		t.Errorf("DELETE covered by WithMethods: %v, keys %q", err, last().keys)
	}
}

func TestReplayed(t *testing.T) {
	s := newScript(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(201)
	})
	c := client()
	defer closeIdle(c)
	resp, err := post(t, c, s.srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if !idemclient.Replayed(resp) || idemclient.Replayed(nil) || idemclient.Attempts(nil) != 0 || idemclient.RequestKey(nil) != "" {
		t.Error("Replayed/Attempts/RequestKey")
	}
	s.answer = statuses(201)
	resp, err = post(t, c, s.srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if idemclient.Replayed(resp) {
		t.Error("a fresh answer is a replay")
	}
}

// TestRetryAfter: both forms are honoured as the wait, a malformed one falls
// back to backoff, one above the cap ends the retries.
func TestRetryAfter(t *testing.T) {
	for _, c := range []struct {
		name   string
		value  func() string
		status int
		check  func(time.Duration) bool
	}{
		{"delta-seconds", func() string { return "1" }, 503, func(d time.Duration) bool { return d == time.Second }},
		{"http-date", func() string { return time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) }, 429,
			func(d time.Duration) bool { return d > 0 && d <= 2*time.Second }},
		{"past date", func() string { return "Sun, 06 Nov 1994 08:49:37 GMT" }, 409, func(d time.Duration) bool { return d == 0 }},
		{"malformed", func() string { return "later" }, 503, func(d time.Duration) bool { return d <= time.Millisecond }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newScript(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 0 {
					w.Header().Set("Retry-After", c.value())
					w.WriteHeader(c.status)
					return
				}
				w.WriteHeader(201)
			})
			var waits []time.Duration
			cl := client(fast(idemclient.WithAttemptHook(func(a idemclient.Attempt) { waits = append(waits, a.Wait) }))...)
			defer closeIdle(cl)
			resp, err := post(t, cl, s.srv.URL, "x")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != 201 || len(waits) != 2 || !c.check(waits[0]) || waits[1] != 0 {
				t.Errorf("status %d waits %v", resp.StatusCode, waits)
			}
		})
	}
	t.Run("above the cap", func(t *testing.T) {
		s := newScript(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(429)
		})
		cl := client(fast(idemclient.WithMaxRetryAfter(time.Minute))...)
		defer closeIdle(cl)
		_, err := post(t, cl, s.srv.URL, "x") //nolint:bodyclose // no response
		var g *idemclient.GaveUpError
		if !errors.As(err, &g) || !errors.Is(err, idemclient.ErrRetryAfterTooLong) || g.Attempts != 1 ||
			g.StatusCode != 429 || g.RetryAfter != time.Hour || g.Key == "" || g.Err != nil {
			t.Fatalf("err %v (%+v)", err, g)
		}
		if n := len(s.requests()); n != 1 {
			t.Errorf("%d requests", n)
		}
	})
}

// TestInProgressBudgetedInTime: 409 in-progress answers don't count
// towards WithMaxAttempts (a takeover after a crash answers only once the
// crashed holder's lease lapsed), failed attempts between them do, and
// WithMaxAttempts(1) still disables every retry.
func TestInProgressBudgetedInTime(t *testing.T) {
	inProgress := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"type":"`+idem.OutcomeInProgress.ProblemType()+`","status":409}`)
	}
	t.Run("in progress", func(t *testing.T) {
		// 12 in-progress answers, two 503s among them, then the answer.
		s := newScript(t, func(n int, w http.ResponseWriter, _ *http.Request) {
			switch {
			case n == 4 || n == 9:
				w.WriteHeader(http.StatusServiceUnavailable)
			case n < 14:
				inProgress(w)
			default:
				w.WriteHeader(http.StatusCreated)
			}
		})
		cl := client(fast(idemclient.WithMaxAttempts(3))...)
		defer closeIdle(cl)
		resp, err := post(t, cl, s.srv.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || idemclient.Attempts(resp) != 15 {
			t.Fatalf("%d after %d attempts; want 201 after 15", resp.StatusCode, idemclient.Attempts(resp))
		}
	})
	t.Run("failures still counted", func(t *testing.T) {
		// A failure, in progress, failures: the third failure ends it.
		s := newScript(t, func(n int, w http.ResponseWriter, _ *http.Request) {
			if n == 1 {
				inProgress(w)
				return
			}
			w.WriteHeader(http.StatusBadGateway)
		})
		cl := client(fast(idemclient.WithMaxAttempts(3))...)
		defer closeIdle(cl)
		_, err := post(t, cl, s.srv.URL, "x") //nolint:bodyclose // no response
		var g *idemclient.GaveUpError
		if !errors.As(err, &g) || !errors.Is(err, idemclient.ErrAttemptsExhausted) || g.Attempts != 4 || g.StatusCode != http.StatusBadGateway {
			t.Fatalf("err %v; want attempts exhausted after 4 attempts (3 failed)", err)
		}
	})
	t.Run("max attempts 1", func(t *testing.T) {
		s := newScript(t, func(_ int, w http.ResponseWriter, _ *http.Request) { inProgress(w) })
		cl := client(fast(idemclient.WithMaxAttempts(1))...)
		defer closeIdle(cl)
		_, err := post(t, cl, s.srv.URL, "x") //nolint:bodyclose // no response
		var g *idemclient.GaveUpError
		if !errors.As(err, &g) || g.Attempts != 1 || len(s.requests()) != 1 {
			t.Fatalf("err %v, %d requests; want one attempt", err, len(s.requests()))
		}
	})
	t.Run("transport failures", func(t *testing.T) {
		// Refused connections are budgeted in time, not attempts: more
		// than DefaultMaxAttempts, then out of time, with the key.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close() // connections are refused
		var attempts atomic.Int64
		cl := client(fast(idemclient.WithMaxElapsed(500*time.Millisecond), idemclient.WithAttemptHook(func(idemclient.Attempt) { attempts.Add(1) }))...)
		defer closeIdle(cl)
		_, err = post(t, cl, "http://"+addr, "x") //nolint:bodyclose // no response
		var g *idemclient.GaveUpError
		if !errors.As(err, &g) || !errors.Is(err, idemclient.ErrOutOfTime) || g.Key == "" || !strings.Contains(err.Error(), "idemclient.WithKey(ctx, \""+g.Key+"\")") {
			t.Fatalf("err %v; want out of time, naming the key to resume with", err)
		}
		if g.Attempts <= idemclient.DefaultMaxAttempts || attempts.Load() != int64(g.Attempts) {
			t.Errorf("gave up after %d attempts (hook saw %d); want more than %d, all reported", g.Attempts, attempts.Load(), idemclient.DefaultMaxAttempts)
		}
	})
	t.Run("server errors counted", func(t *testing.T) {
		// A 500 (the handler ran and failed) is retried DefaultMaxAttempts
		// times at most, without WithMaxAttempts.
		s := newScript(t, statuses(500))
		cl := client(fast()...)
		defer closeIdle(cl)
		_, err := post(t, cl, s.srv.URL, "x") //nolint:bodyclose // no response
		var g *idemclient.GaveUpError
		if !errors.As(err, &g) || !errors.Is(err, idemclient.ErrAttemptsExhausted) || g.Attempts != idemclient.DefaultMaxAttempts || len(s.requests()) != idemclient.DefaultMaxAttempts {
			t.Fatalf("err %v, %d requests; want attempts exhausted after %d", err, len(s.requests()), idemclient.DefaultMaxAttempts)
		}
	})
	t.Run("name not found", func(t *testing.T) {
		// A failure no retry fixes ends at once.
		var attempts atomic.Int64
		cl := client(fast(idemclient.WithMaxElapsed(10*time.Second), idemclient.WithAttemptHook(func(idemclient.Attempt) { attempts.Add(1) }))...)
		defer closeIdle(cl)
		_, err := post(t, cl, "http://no-such-host.invalid", "x") //nolint:bodyclose // no response
		var dns *net.DNSError
		if !errors.As(err, &dns) || !dns.IsNotFound || attempts.Load() != 1 {
			t.Fatalf("err %v after %d attempts; want the DNS error after one", err, attempts.Load())
		}
	})
}

// TestCaps: attempts, total time and the request's deadline bound the retries.
func TestCaps(t *testing.T) {
	s := newScript(t, statuses(503))
	t.Run("attempts", func(t *testing.T) {
		cl := client(fast(idemclient.WithMaxAttempts(3))...)
		defer closeIdle(cl)
		before := len(s.requests())
		_, err := post(t, cl, s.srv.URL, "x") //nolint:bodyclose // no response
		var g *idemclient.GaveUpError
		if !errors.As(err, &g) || !errors.Is(err, idemclient.ErrAttemptsExhausted) || g.Attempts != 3 || g.StatusCode != 503 {
			t.Fatalf("err %v", err)
		}
		if n := len(s.requests()) - before; n != 3 {
			t.Errorf("%d requests, want 3", n)
		}
		for _, r := range s.requests()[before:] {
			if r.keys[0] != g.Key {
				t.Errorf("sent key %q, GaveUpError.Key %q", r.keys, g.Key)
			}
		}
		if !strings.Contains(err.Error(), "gave up after 3 attempt(s)") || !strings.Contains(err.Error(), g.Key) {
			t.Errorf("message: %v", err)
		}
	})
	t.Run("max attempts 1", func(t *testing.T) {
		cl := client(fast(idemclient.WithMaxAttempts(0))...) // clamped to 1
		defer closeIdle(cl)
		_, err := post(t, cl, s.srv.URL, "x") //nolint:bodyclose // no response
		var g *idemclient.GaveUpError
		if !errors.As(err, &g) || g.Attempts != 1 {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("elapsed", func(t *testing.T) {
		cl := client(idemclient.WithBackoff(time.Hour, time.Hour), idemclient.WithMaxElapsed(time.Minute))
		defer closeIdle(cl)
		// A 503 without Retry-After: the first backoff is up to an hour, so
		// unless the draw is under a minute (p = 1/60) it is out of time at once.
		var g *idemclient.GaveUpError
		for range 20 {
			_, err := post(t, cl, s.srv.URL, "x") //nolint:bodyclose // no response
			if errors.As(err, &g) && errors.Is(err, idemclient.ErrOutOfTime) && g.Attempts == 1 {
				return
			}
			if !errors.As(err, &g) {
				t.Fatalf("err %v", err)
			}
		}
		t.Fatal("never out of time")
	})
	t.Run("deadline", func(t *testing.T) {
		s := newScript(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "20")
			w.WriteHeader(503)
		})
		cl := client()
		defer closeIdle(cl)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL, strings.NewReader("x"))
		_, err := cl.Do(req) //nolint:bodyclose // no response
		if !errors.Is(err, idemclient.ErrOutOfTime) || ctx.Err() != nil {
			t.Fatalf("err %v, ctx %v: want ErrOutOfTime at once", err, ctx.Err())
		}
	})
}

// TestCancel: the request context wins, during a wait and during an attempt.
func TestCancel(t *testing.T) {
	t.Run("during the wait", func(t *testing.T) {
		s := newScript(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "20")
			w.WriteHeader(409)
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cl := client(idemclient.WithAttemptHook(func(a idemclient.Attempt) {
			if a.Wait == 20*time.Second {
				cancel()
			}
		}))
		defer closeIdle(cl)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL, strings.NewReader("x"))
		_, err := cl.Do(req) //nolint:bodyclose // no response
		var g *idemclient.GaveUpError
		if !errors.As(err, &g) || !errors.Is(err, context.Canceled) || g.Attempts != 1 || g.StatusCode != 409 {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("during an attempt", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s := newScript(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
			cancel()
			<-r.Context().Done() // the client hung up
		})
		var hooked []idemclient.Attempt
		cl := client(idemclient.WithAttemptHook(func(a idemclient.Attempt) { hooked = append(hooked, a) }))
		defer closeIdle(cl)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL, strings.NewReader("x"))
		_, err := cl.Do(req) //nolint:bodyclose // no response
		if !errors.Is(err, context.Canceled) || len(s.requests()) != 1 || len(hooked) != 1 || !errors.Is(hooked[0].GaveUp, context.Canceled) {
			t.Fatalf("err %v, %d requests, hook %+v", err, len(s.requests()), hooked)
		}
	})
	t.Run("cancelled before", func(t *testing.T) {
		s := newScript(t, statuses(201))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		cl := client()
		defer closeIdle(cl)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL, strings.NewReader("x"))
		if _, err := cl.Do(req); !errors.Is(err, context.Canceled) { //nolint:bodyclose // no response
			t.Fatalf("err %v", err)
		}
		if n := len(s.requests()); n != 0 {
			t.Errorf("%d requests", n)
		}
	})
}

// TestTransportErrors: refused, closed before a response and reset
// connections are retried with the same key; other errors are not.
func TestTransportErrors(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		cl := client(fast(idemclient.WithMaxAttempts(3))...)
		defer closeIdle(cl)
		_, err = post(t, cl, "http://"+addr, "x") //nolint:bodyclose // no response
		var g *idemclient.GaveUpError
		if !errors.As(err, &g) || !errors.Is(err, syscall.ECONNREFUSED) || g.Attempts != 3 || g.StatusCode != 0 {
			t.Fatalf("err %v", err)
		}
	})
	for _, c := range []struct {
		name string
		cut  func(net.Conn)
	}{
		{"closed before the response", func(conn net.Conn) { _ = conn.Close() }},
		{"reset", func(conn net.Conn) { _ = conn.(*net.TCPConn).SetLinger(0); _ = conn.Close() }},
		{"cut in the status line", func(conn net.Conn) { _, _ = conn.Write([]byte("HTTP/1.1 20")); _ = conn.Close() }},
		{"cut in the headers", func(conn net.Conn) {
			_, _ = conn.Write([]byte("HTTP/1.1 201 Created\r\nContent-Length: 2\r\n"))
			_ = conn.Close()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newScript(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 0 {
					conn, _, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Error(err)
						return
					}
					c.cut(conn)
					return
				}
				w.WriteHeader(201)
			})
			var hooked []idemclient.Attempt
			cl := client(fast(idemclient.WithAttemptHook(func(a idemclient.Attempt) { hooked = append(hooked, a) }))...)
			defer closeIdle(cl)
			resp, err := post(t, cl, s.srv.URL, "payload")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			got := s.requests()
			if resp.StatusCode != 201 || idemclient.Attempts(resp) != 2 || len(got) != 2 || got[0].keys[0] != got[1].keys[0] || got[1].body != "payload" {
				t.Fatalf("status %d attempts %d requests %+v", resp.StatusCode, idemclient.Attempts(resp), got)
			}
			if hooked[0].Err == nil || hooked[0].Decision != idemclient.Retry {
				t.Errorf("first attempt: %+v", hooked[0])
			}
		})
	}
	t.Run("not retried", func(t *testing.T) {
		var n int
		cl := client(fast(idemclient.WithAttemptHook(func(idemclient.Attempt) { n++ }))...)
		defer closeIdle(cl)
		_, err := post(t, cl, "ftp://127.0.0.1/", "x") //nolint:bodyclose // no response
		var g *idemclient.GaveUpError
		if err == nil || errors.As(err, &g) || n != 1 {
			t.Fatalf("err %v, %d attempts", err, n)
		}
	})
}

// TestAttemptTimeout: an attempt whose answer is late is abandoned and
// retried; the final response's body stays readable after RoundTrip, within
// the attempt's timeout, which covers the body too (as http.Client.Timeout).
func TestAttemptTimeout(t *testing.T) {
	s := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 0, 2:
			<-r.Context().Done() // answers only after the client gave up
		case 1:
			w.WriteHeader(201)
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "created")
		default:
			w.WriteHeader(201)
			w.(http.Flusher).Flush()
			<-r.Context().Done() // the body never comes
		}
	})
	cl := client(fast(idemclient.WithAttemptTimeout(time.Second))...)
	defer closeIdle(cl)
	resp, err := post(t, cl, s.srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 201 || idemclient.Attempts(resp) != 2 || err != nil || string(b) != "created" {
		t.Fatalf("status %d attempts %d body %q err %v", resp.StatusCode, idemclient.Attempts(resp), b, err)
	}
	resp, err = post(t, cl, s.srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !errors.Is(err, context.DeadlineExceeded) || idemclient.Attempts(resp) != 2 {
		t.Fatalf("a body slower than the attempt timeout: %v, attempts %d", err, idemclient.Attempts(resp))
	}
}

// errReader is a body without GetBody.
type errReader struct {
	r      io.Reader
	closed bool
}

func (e *errReader) Read(p []byte) (int, error) { return e.r.Read(p) }
func (e *errReader) Close() error               { e.closed = true; return nil }

// TestBodies: GetBody, a buffered stream and an over-limit stream.
func TestBodies(t *testing.T) {
	t.Run("buffered stream", func(t *testing.T) {
		s := newScript(t, statuses(502, 503, 201))
		cl := client(fast(idemclient.WithBodyLimit(64))...)
		defer closeIdle(cl)
		body := &errReader{r: strings.NewReader(strings.Repeat("b", 64))}
		req, _ := http.NewRequest(http.MethodPost, s.srv.URL, body)
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 201 || !body.closed {
			t.Fatalf("status %d, body closed %v", resp.StatusCode, body.closed)
		}
		for _, r := range s.requests() {
			if r.body != strings.Repeat("b", 64) {
				t.Errorf("body %q", r.body)
			}
		}
	})
	for _, final := range []int{201, 503} {
		t.Run("stream above the limit/"+strconv.Itoa(final), func(t *testing.T) {
			s := newScript(t, statuses(final))
			cl := client(fast(idemclient.WithBodyLimit(10))...)
			defer closeIdle(cl)
			body := &errReader{r: strings.NewReader(strings.Repeat("s", 100))}
			req, _ := http.NewRequest(http.MethodPost, s.srv.URL, body)
			resp, err := cl.Do(req)
			if got := s.requests(); len(got) != 1 || got[0].body != strings.Repeat("s", 100) {
				t.Fatalf("requests %+v", got)
			}
			if final == 201 {
				if err != nil || resp.StatusCode != 201 {
					t.Fatalf("err %v", err)
				}
				_ = resp.Body.Close()
				return
			}
			var g *idemclient.GaveUpError
			if !errors.As(err, &g) || !errors.Is(err, idemclient.ErrBodyNotReplayable) || g.Attempts != 1 || g.StatusCode != 503 {
				t.Fatalf("err %v", err)
			}
		})
	}
	t.Run("GetBody", func(t *testing.T) {
		s := newScript(t, statuses(500, 201))
		cl := client(fast(idemclient.WithBodyLimit(1))...) // not buffered: GetBody re-reads it
		defer closeIdle(cl)
		req, _ := http.NewRequest(http.MethodPost, s.srv.URL, bytes.NewReader([]byte("twelve bytes")))
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if got := s.requests(); len(got) != 2 || got[0].body != "twelve bytes" || got[1].body != "twelve bytes" {
			t.Fatalf("requests %+v", got)
		}
	})
	t.Run("GetBody fails", func(t *testing.T) {
		s := newScript(t, statuses(500, 201))
		cl := client(fast()...)
		defer closeIdle(cl)
		req, _ := http.NewRequest(http.MethodPost, s.srv.URL, strings.NewReader("x"))
		req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("gone") }
		_, err := cl.Do(req) //nolint:bodyclose // no response
		if err == nil || !strings.Contains(err.Error(), "gone") || len(s.requests()) != 1 {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("no body", func(t *testing.T) {
		s := newScript(t, statuses(504, 201))
		cl := client(fast()...)
		defer closeIdle(cl)
		req, _ := http.NewRequest(http.MethodPost, s.srv.URL, nil)
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if idemclient.Attempts(resp) != 2 {
			t.Errorf("attempts %d", idemclient.Attempts(resp))
		}
	})
}

// TestConcurrent: one Transport, many goroutines, a key each.
func TestConcurrent(t *testing.T) {
	s := newScript(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n%2 == 0 {
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(201)
	})
	cl := client(fast(idemclient.WithMaxAttempts(50))...)
	defer closeIdle(cl)
	var wg sync.WaitGroup
	keys := make([]string, 20)
	for i := range keys {
		wg.Go(func() {
			resp, err := post(t, cl, s.srv.URL, strconv.Itoa(i))
			if err != nil {
				t.Errorf("%d: %v", i, err)
				return
			}
			_ = resp.Body.Close()
			keys[i] = idemclient.RequestKey(resp)
		})
	}
	wg.Wait()
	bodies := map[string]string{}
	for _, r := range s.requests() {
		if b, ok := bodies[r.keys[0]]; ok && b != r.body {
			t.Errorf("key %s sent with bodies %q and %q", r.keys[0], b, r.body)
		}
		bodies[r.keys[0]] = r.body
	}
	if len(bodies) != 20 {
		t.Errorf("%d keys for 20 logical requests", len(bodies))
	}
}

// TestResponseBuffer: a reply cut inside its body is retried when the
// Transport buffers final bodies, and fails the caller's read when not.
func TestResponseBuffer(t *testing.T) {
	cutFirst := func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = conn.Write([]byte("HTTP/1.1 201 Created\r\nContent-Length: 20\r\n\r\n{\"id\":"))
			_ = conn.Close()
			return
		}
		w.WriteHeader(201)
		_, _ = io.WriteString(w, `{"id":"pay_12345678"}`)
	}
	read := func(cl *http.Client, url string) (*http.Response, string, error) {
		resp, err := post(t, cl, url, "x")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, string(b), err
	}
	t.Run("off", func(t *testing.T) {
		s := newScript(t, cutFirst)
		cl := client(fast()...)
		defer closeIdle(cl)
		resp, _, err := read(cl, s.srv.URL)
		if !errors.Is(err, io.ErrUnexpectedEOF) || idemclient.Attempts(resp) != 1 {
			t.Fatalf("read %v after %d attempts; want the cut to reach the caller", err, idemclient.Attempts(resp))
		}
	})
	t.Run("on", func(t *testing.T) {
		s := newScript(t, cutFirst)
		var hooked []idemclient.Attempt
		cl := client(fast(idemclient.WithResponseBuffer(1<<10), idemclient.WithAttemptHook(func(a idemclient.Attempt) { hooked = append(hooked, a) }))...)
		defer closeIdle(cl)
		resp, body, err := read(cl, s.srv.URL)
		if err != nil || body != `{"id":"pay_12345678"}` || idemclient.Attempts(resp) != 2 {
			t.Fatalf("body %q err %v after %d attempts", body, err, idemclient.Attempts(resp))
		}
		if got := s.requests(); got[0].keys[0] != got[1].keys[0] {
			t.Error("the retry changed the key")
		}
		if !errors.Is(hooked[0].Err, io.ErrUnexpectedEOF) || hooked[0].Decision != idemclient.Retry || hooked[0].Response != nil {
			t.Errorf("first attempt: %+v", hooked[0])
		}
	})
	t.Run("longer than the buffer", func(t *testing.T) {
		long := strings.Repeat("z", 5000)
		s := newScript(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(200)
			_, _ = io.WriteString(w, long)
			w.(http.Flusher).Flush() // chunked: no Content-Length
		})
		cl := client(fast(idemclient.WithResponseBuffer(100), idemclient.WithAttemptTimeout(time.Minute))...)
		defer closeIdle(cl)
		_, body, err := read(cl, s.srv.URL)
		if err != nil || body != long {
			t.Fatalf("body of %d bytes, err %v", len(body), err)
		}
	})
}

type idleCounter struct {
	http.RoundTripper
	closed int
}

func (c *idleCounter) CloseIdleConnections() { c.closed++ }

func TestCloseIdleConnections(t *testing.T) {
	base := &idleCounter{RoundTripper: http.DefaultTransport}
	c := &http.Client{Transport: idemclient.New(idemclient.WithBase(base))}
	c.CloseIdleConnections()
	if base.closed != 1 {
		t.Errorf("base CloseIdleConnections called %d times", base.closed)
	}
	idemclient.New(idemclient.WithBase(struct{ http.RoundTripper }{http.DefaultTransport})).CloseIdleConnections() // no such method: nothing
}

// TestNetHTTPReplay: Go's http.Transport re-sends a request carrying an
// Idempotency-Key by itself when a reused keep-alive connection closes
// before any response byte (golang/go#19943). The server then sees the
// request twice within one send, with the same key and body: safe, and
// counted as an attempt of its own (Attempts, the hook with ErrResent).
func TestNetHTTPReplay(t *testing.T) {
	s := newScript(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 { // the second request, on the kept-alive connection: closed unanswered
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_ = conn.Close()
			return
		}
		w.WriteHeader(201)
	})
	var hooked []idemclient.Attempt
	cl := client(idemclient.WithAttemptHook(func(a idemclient.Attempt) { hooked = append(hooked, a) }))
	defer closeIdle(cl)
	for i, want := range []int{1, 2} {
		resp, err := post(t, cl, s.srv.URL, "same body")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if idemclient.Attempts(resp) != want || resp.StatusCode != 201 {
			t.Fatalf("call %d: %d after %d attempts, want 201 after %d", i+1, resp.StatusCode, idemclient.Attempts(resp), want)
		}
	}
	got := s.requests()
	if len(got) != 3 || len(hooked) != 3 {
		t.Fatalf("server saw %d requests, the hook %d attempts; want 3 and 3 (one re-sent by net/http)", len(got), len(hooked))
	}
	if a := hooked[1]; !errors.Is(a.Err, idemclient.ErrResent) || a.N != 1 || a.Decision != idemclient.Retry || hooked[2].N != 2 || hooked[2].Err != nil {
		t.Errorf("hooked re-send %+v, then %+v", a, hooked[2])
	}
	if got[1].keys[0] != got[2].keys[0] || got[1].body != got[2].body || got[0].keys[0] == got[1].keys[0] {
		t.Errorf("net/http's re-send: %+v", got)
	}
}
