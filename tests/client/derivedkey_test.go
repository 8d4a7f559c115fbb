package client_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/adapters/idemhttp"
	"github.com/idemkit/idem/client/idemclient"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/memstore"
)

// TestDerivedKeyAcrossServices: service A calls service B through
// idemclient (WithKeyFromContext) inside a repeatable step of its own
// execution; A's holder stalls after B answered (it stops renewing, as a
// crashed or paused process) and a second instance of A, on the same
// store, takes the retry over: it runs the step again and sends B the same
// derived key, so B executes once and A's answer carries B's first result.
func TestDerivedKeyAcrossServices(t *testing.T) {
	// B: an idem service over TCP that counts its executions.
	var bRuns atomic.Int32
	var mu sync.Mutex
	var bKeys []string
	bStore := memstore.New()
	defer bStore.Close()
	bEngine, err := idem.New(bStore, idem.WithGlobalScope(), idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	protected := idemhttp.New(bEngine)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := bRuns.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"charge":"ch_`+strconv.Itoa(int(n))+`"}`)
	}))
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { // every request's key, replays too
		mu.Lock()
		bKeys = append(bKeys, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		protected.ServeHTTP(w, r)
	}))
	defer b.Close()
	defer func() { _ = bEngine.Close(context.Background()) }()

	// A: two instances on one store; the first stalls after B answered.
	shared := memstore.New()
	defer shared.Close()
	stalling := storetest.NewStalling(shared)
	quiet := idem.WithLogger(slog.New(slog.DiscardHandler))
	a1, err := idem.New(stalling, quiet, idem.WithLease(time.Second), idem.WithStoreTimeout(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := idem.New(stalling, quiet, idem.WithLease(time.Second), idem.WithStoreTimeout(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a1.Close(context.Background()) }()
	defer func() { _ = a2.Close(context.Background()) }()
	client := &http.Client{Transport: idemclient.New(idemclient.WithKeyFromContext())}
	defer client.CloseIdleConnections()
	var stallOnce func() // the first instance's crash point: after B answered, before the step is journaled
	callB := func(ctx context.Context) (string, error) {
		return idem.Step(ctx, "charge-via-b", func(ctx context.Context) (string, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.URL+"/v1/charges", strings.NewReader(`{"amount":100}`))
			if err != nil {
				return "", err
			}
			resp, err := client.Do(req)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if stallOnce != nil {
				f := stallOnce
				stallOnce = nil
				f()
			}
			return string(body), err
		}, idem.Repeatable())
	}
	op := idem.Operation{Scope: "acct_1", Name: "create-payment", Key: "pay-42"}
	answered, release := make(chan struct{}), make(chan struct{})
	firstErr := make(chan error, 1)
	stallOnce = func() {
		stalling.Stall() // this holder stops renewing
		close(answered)
		<-release
	}
	go func() {
		_, err := idem.Do(context.Background(), a1, op, callB)
		firstErr <- err
	}()
	<-answered
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got string
	for {
		got, err = idem.Do(ctx, a2, op, callB)
		if err == nil {
			break
		}
		if !errors.Is(err, idem.ErrInProgress) || ctx.Err() != nil {
			close(release)
			t.Fatalf("the second instance's retry: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(release)
	if err := <-firstErr; err == nil {
		t.Fatal("the stalled instance journaled its step after its lease was taken over")
	}
	if bRuns.Load() != 1 || got != `{"charge":"ch_1"}` {
		t.Fatalf("B executed %d times, A answered %q; want once, B's first answer", bRuns.Load(), got)
	}
	if len(bKeys) != 2 || bKeys[0] != bKeys[1] || !strings.HasPrefix(bKeys[0], "idem-") || len(bKeys[0]) != 69 {
		t.Fatalf("B saw keys %q; want the same derived key (idem- and 64 hex) twice", bKeys)
	}
}
