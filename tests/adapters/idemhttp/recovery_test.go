package idemhttp_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
)

type payerKey struct{}

// auth is a service's authentication: a bearer token names the user; a
// recovery run ([idem.RecoveryHeader]) is authenticated by the engine's
// hook as the stored principal instead.
func recoveringAuth(e *idem.Engine, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := e.RecoveryPrincipal(r.Header.Get(idem.RecoveryHeader))
		if !ok {
			user, ok = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		}
		if !ok || user == "" {
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), payerKey{}, user)))
	})
}

// TestRecoveryThroughAuthHook: a recoverable route's request whose holder
// stopped and whose client never came back is run again by a Recoverer
// through the service's handler chain in process (idem.HTTPRunner): the
// authentication re-establishes the stored principal through
// Engine.RecoveryPrincipal, the declared header line is kept, the
// credential is not, and the client's late retry gets the answer
// replayed. A client sending the header with a made-up nonce is
// authenticated as usual and refused 403 by the engine.
func TestRecoveryThroughAuthHook(t *testing.T) {
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	e, err := idem.New(adaptertest.CrashableRecoverable(store), idem.WithLogger(slog.New(slog.DiscardHandler)),
		idem.WithLease(time.Second), idem.WithStoreTimeout(250*time.Millisecond),
		idem.WithRoute("POST", "/v1/payments", idem.RouteRecovery("X-Source")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	var runs atomic.Int64
	release := make(chan struct{})
	var seen sync.Map // run → what the handler saw
	payments := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		seen.Store(n, r.Context().Value(payerKey{}).(string)+"|"+r.Header.Get("X-Source")+"|"+r.Header.Get("Authorization")+"|"+string(body))
		if n == 1 {
			<-release // the holder stops here: its lease lapses
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "paid")
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", idemhttp.New(e, idemhttp.WithScope(func(r *http.Request) string {
		return r.Context().Value(payerKey{}).(string)
	}))(payments))
	chain := recoveringAuth(e, mux)
	srv := httptest.NewServer(chain)
	t.Cleanup(srv.Close)
	var held sync.WaitGroup
	t.Cleanup(held.Wait)
	t.Cleanup(func() { close(release) })

	send := func(ctx context.Context, h http.Header) (*http.Response, string, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/payments?x=1", strings.NewReader(`{"amount":5}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set("X-Source", "mobile")
		req.Header.Set("Idempotency-Key", "pay-1")
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b), nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	held.Add(1)
	go func() {
		defer held.Done()
		_, _, _ = send(ctx, nil)
	}()
	for deadline := time.Now().Add(10 * time.Second); runs.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first request never reached the handler")
		}
	}
	cancel() // the client gives up

	resp, body, err := send(context.Background(), http.Header{idem.RecoveryHeader: {"00112233445566778899aabbccddeeff"}})
	if err != nil || resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "recovery-refused") || runs.Load() != 1 {
		t.Fatalf("forged recovery header: %v %v %s, runs %d; want 403 recovery-refused, nothing run", resp, err, body, runs.Load())
	}

	rec, err := idem.NewRecoverer(e, idem.RecoverRequests(idem.HTTPRunner(chain)), idem.RecoverBackoff(50*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	adaptertest.RecoverOne(t, rec)
	got, _ := seen.Load(int64(2))
	if want := `alice|mobile||{"amount":5}`; got != want {
		t.Fatalf("the recovery run saw principal|X-Source|Authorization|body %q, want %q", got, want)
	}
	resp, body, err = send(context.Background(), nil)
	if err != nil || resp.StatusCode != http.StatusCreated || body != "paid" || resp.Header.Get(idem.ReplayedHeader) != "true" || runs.Load() != 2 {
		t.Fatalf("late retry: %v %v %q, runs %d; want the recovery's 201 replayed", resp, err, body, runs.Load())
	}
}
