package memstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

// TestUncertainLoggedOnce: the engine answers every retry of a crashed
// execution's key 409 operation-uncertain and logs the key, whole, once,
// for the operator's idemctl.
func TestUncertainLoggedOnce(t *testing.T) {
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	var logs bytes.Buffer
	e, err := idem.New(s, idem.WithUncertainAfterCrash(time.Hour), idem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := func() *idem.Request {
		return &idem.Request{Method: "POST", Route: "/v1/payments", Path: "/v1/payments", Keys: []string{"k1"}, Principal: "alice"}
	}
	scoped := idem.ScopedKey("alice", "POST", "/v1/payments", "k1")
	fp := idem.Fingerprint("POST", "/v1/payments", "", "", nil)
	if _, ok, err := s.AcquireKeep(ctx, scoped, "crashed", fp, 50*time.Millisecond, idem.Keep{Uncertain: time.Hour}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	time.Sleep(100 * time.Millisecond)
	for range 3 {
		x, resp := e.Begin(ctx, req())
		if x != nil || resp == nil || resp.Status != http.StatusConflict || !strings.Contains(string(resp.Body), "operation-uncertain") {
			t.Fatalf("retry: execution %v, answer %+v; want 409 operation-uncertain", x != nil, resp)
		}
	}
	if n := strings.Count(logs.String(), "operation uncertain"); n != 1 || !strings.Contains(logs.String(), "key="+scoped) {
		t.Fatalf("log = %q; want one line with key=%s", logs.String(), scoped)
	}
}
