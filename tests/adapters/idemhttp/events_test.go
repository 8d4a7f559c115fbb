package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

// TestEventsAndLogs checks that every decision reaches the event hook and
// that logs never carry the raw idempotency key.
func TestEventsAndLogs(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	var mu sync.Mutex
	var kinds []string
	var logs bytes.Buffer
	e, err := idem.New(store,
		idem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		idem.WithEventHook(func(_ context.Context, ev idem.Event) {
			mu.Lock()
			kinds = append(kinds, ev.Kind.String())
			mu.Unlock()
			if ev.Kind != idem.EventRejected && len(ev.Key) != 64 {
				t.Errorf("%s event with key %q; want the 64-hex scoped key", ev.Kind, ev.Key)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	h := idemhttp.New(e, idemhttp.WithScope(func(r *http.Request) string { return r.Header.Get("X-User") }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("fail") == "1" {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
	send := func(key, body, query string) int {
		r := httptest.NewRequest("POST", "/p"+query, strings.NewReader(body))
		r.Header.Set("X-User", "u1")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	const secret = "raw-key-never-logged-7f3a"
	send(secret, "a", "")      // acquired, completed
	send(secret, "a", "")      // replayed
	send(secret, "b", "")      // mismatch
	send("", "a", "")          // rejected
	send("k2", "a", "?fail=1") // acquired, released
	want := "acquired completed replayed mismatch rejected acquired released"
	if got := strings.Join(kinds, " "); got != want {
		t.Fatalf("events = %q, want %q", got, want)
	}

	down, err := idem.New(downStore{}, idem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = down.Close(ctx)
	}()
	h = idemhttp.New(down, idemhttp.WithScope(func(*http.Request) string { return "u1" }))(http.NotFoundHandler())
	if code := send(secret, "a", ""); code != http.StatusServiceUnavailable {
		t.Fatalf("store down: %d", code)
	}
	if !strings.Contains(logs.String(), "acquire failed") {
		t.Fatalf("store error not logged: %s", logs.String())
	}
	if strings.Contains(logs.String(), secret) {
		t.Fatalf("a raw idempotency key reached the logs: %s", logs.String())
	}
}

type downStore struct{ idem.Store }

func (downStore) Acquire(context.Context, string, string, string, time.Duration) (idem.Record, bool, error) {
	return idem.Record{}, false, errors.New("connection refused")
}

// Release is what Close's last try at the background release calls.
func (downStore) Release(context.Context, string, string) error {
	return errors.New("connection refused")
}
