// Package client is what the adapter tests share to talk to a real server:
// requests carrying the suite's principal and an idempotency key, their
// replies, engines on a fresh memstore, a log to read, and a wait for an
// operation's record to reach an outcome.
package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
)

// Reply is what a client got.
type Reply struct {
	Status int
	Header http.Header
	Body   string
}

// Replayed reports whether r carries the replay marker.
func (r Reply) Replayed() bool { return r.Header.Get(idem.ReplayedHeader) == "true" }

// NewStore returns a memstore closed when t ends.
func NewStore(t *testing.T) idem.Store {
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	return s
}

// Engine returns an engine on a fresh memstore with opts, logging nothing.
func Engine(t *testing.T, opts ...idem.Option) *idem.Engine {
	opts = append([]idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	e, err := idem.New(NewStore(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// NewRequest returns a JSON POST of body to url as the principal "alice",
// with the idempotency key key unless it is empty.
func NewRequest(ctx context.Context, url, key, body string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(adaptertest.PrincipalHeader, "alice")
	if key != "" {
		req.Header.Set(idem.DefaultHeader, key)
	}
	return req
}

// Do sends req and reads the whole reply; it fails t on a transport error.
func Do(t *testing.T, req *http.Request) Reply {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return Reply{resp.StatusCode, resp.Header, string(b)}
}

// Post is Do(NewRequest(context.Background(), url, key, body)).
func Post(t *testing.T, url, key, body string) Reply {
	t.Helper()
	return Do(t, NewRequest(context.Background(), url, key, body))
}

// NewWithoutScopePanics checks an adapter's New, called by build with no
// scope function: for an engine without WithGlobalScope it must panic with a
// message naming pkg.WithScope and idem.WithGlobalScope (the fixes), and for
// one with WithGlobalScope it must not panic. pkg is the adapter's package
// name, such as "idemgin".
func NewWithoutScopePanics(t *testing.T, pkg string, build func(*idem.Engine)) {
	t.Helper()
	store := memstore.New()
	defer store.Close()
	e, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			p := fmt.Sprint(recover())
			if !strings.Contains(p, pkg+".WithScope") || !strings.Contains(p, "idem.WithGlobalScope") {
				t.Fatalf("New without WithScope: panic %q; want one naming %s.WithScope and idem.WithGlobalScope", p, pkg)
			}
		}()
		build(e)
	}()
	g, err := idem.New(store, idem.WithGlobalScope())
	if err != nil {
		t.Fatal(err)
	}
	build(g) // no principals declared: no scope needed
}

// Log is a slog destination safe for concurrent use, for tests that read
// what a handler logged.
type Log struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// WaitForDo calls idem.Do on op every 50ms (failing the test if its
// function ever runs) until it returns an error matching want, for up to
// 20s: a lease or a retention lapsing.
func WaitForDo(t *testing.T, e *idem.Engine, op idem.Operation, want error) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := idem.Do(context.Background(), e, op, func(context.Context) (struct{}, error) {
			t.Error("the operation ran again")
			return struct{}{}, nil
		})
		if errors.Is(err, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Do never answered %v (last %v)", want, err)
		}
	}
}

// Hold runs op through idem.Do on e with a function that blocks until
// release is called: another instance's execution in progress (or, once
// its lease lapsed on a store from adaptertest.Crashable, one that looks
// crashed). It returns once the function started; release ends it and
// fails the test if Do then failed.
func Hold(t *testing.T, e *idem.Engine, op idem.Operation) (release func()) {
	t.Helper()
	started, finish := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := idem.Do(context.Background(), e, op, func(context.Context) (struct{}, error) {
			close(started)
			<-finish
			return struct{}{}, nil
		})
		held <- err
	}()
	<-started
	return func() {
		t.Helper()
		close(finish)
		if err := <-held; err != nil {
			t.Errorf("the held execution: %v", err)
		}
	}
}
