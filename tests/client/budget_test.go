package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/adapters/idemhttp"
	"github.com/idemkit/idem/client/idemclient"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
)

// TestClientWaitsOutTakeover: a payment retried through idemclient with its
// default options after the service's holder crashed mid-handler (past its
// idem.Step, its 10s lease no longer renewed, so the retry gets 409
// in-progress answers until it lapses: more than the default attempts)
// waits them out and gets the takeover's answer, with the step's journaled
// charge (one charge); a refused connection is retried for the time
// budget, and the error carries the key.
func TestClientWaitsOutTakeover(t *testing.T) {
	t.Parallel()
	mem := memstore.New()
	defer mem.Close()
	e, err := idem.New(adaptertest.CrashableJournal(mem), idem.WithLease(10*time.Second), idem.WithStoreTimeout(250*time.Millisecond),
		idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(context.Background()) }()
	var runs, charges, journaled atomic.Int64
	crashed := make(chan struct{}) // holds the first run, the crashed holder, until the end
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run := runs.Add(1)
		id, err := idem.Step(r.Context(), "charge", func(context.Context) (string, error) {
			return fmt.Sprintf("ch_%d", charges.Add(1)), nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		journaled.Add(1)
		if run == 1 {
			<-crashed
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"charge":%q,"run":%d}`, id, run)
	})
	srv := httptest.NewServer(idemhttp.New(e, idemhttp.WithScope(func(*http.Request) string { return "alice" }))(app))
	defer srv.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(crashed)

	ctx := context.Background()                                                                      // no deadline: idemclient's default budget is under test
	wg.Go(func() { _, _ = order(ctx, http.DefaultClient, srv.URL, "pay-crash", `{"amount":1200}`) }) //nolint:bodyclose // closed by order; its answer is not the key's
	for deadline := time.Now().Add(30 * time.Second); journaled.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first run never got past its step")
		}
	}
	var mu sync.Mutex
	inProgress := 0
	cl := &http.Client{Transport: idemclient.New(idemclient.WithAttemptHook(func(a idemclient.Attempt) {
		if a.Err == nil && a.Response.StatusCode == http.StatusConflict {
			mu.Lock()
			inProgress++
			mu.Unlock()
		}
	}))}
	defer cl.CloseIdleConnections()
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"amount":1200}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemclient.HeaderKey, "pay-crash")
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("retry after the crash: %v after %v; want the takeover's answer", err, time.Since(start))
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(body) != `{"charge":"ch_1","run":2}` || charges.Load() != 1 {
		t.Fatalf("retry got %d %s, %d charges; want 201 from the takeover (run 2) with the journaled ch_1, one charge", resp.StatusCode, body, charges.Load())
	}
	mu.Lock()
	waited := inProgress
	mu.Unlock()
	if waited == 0 {
		t.Fatal("the retry never got an in-progress answer: the test waited for nothing")
	}
	t.Logf("the retry got the takeover's answer after %v, %d attempts, %d of them 409 in progress",
		time.Since(start).Round(time.Millisecond), idemclient.Attempts(resp), waited)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	_ = ln.Close() // connections are refused
	short := &http.Client{Transport: idemclient.New(idemclient.WithMaxElapsed(time.Second))}
	defer short.CloseIdleConnections()
	var g *idemclient.GaveUpError
	if _, err := order(ctx, short, closed, "pay-down", `{"amount":1}`); !errors.As(err, &g) || !errors.Is(err, idemclient.ErrOutOfTime) || g.Key != "pay-down" { //nolint:bodyclose // no response
		t.Fatalf("order to a closed port: %v; want a GaveUpError out of time, with the key", err)
	}
}
