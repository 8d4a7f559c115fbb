package benchmarks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

// full enables the heavy cases (10^6 preload, end-to-end processes); `make
// bench` sets it, `make test` (-benchtime=1x) does not.
var full = flag.Bool("bench.full", false, "run the heavy benchmarks: 10^6 preloaded records and end-to-end load against example processes")

// Shared request and response of every framework case: a small JSON charge
// answered 201 with a small JSON body.
var (
	reqBody  = []byte(`{"amount":4200,"currency":"EUR"}`)
	respBody = []byte(`{"id":"pay_1","amount":4200,"currency":"EUR","status":"succeeded"}`)
)

const (
	route     = "/v1/payments"
	principal = "user_1"
)

// runID makes keys unique across processes sharing a Redis or MongoDB.
var runID = func() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

var keySeq atomic.Uint64

// newKey returns a fresh UUID-shaped idempotency key (36 characters, as
// Fiber's built-in middleware demands): one allocation.
func newKey() string {
	var b [36]byte
	copy(b[:], "00000000-0000-4000-8000-000000000000")
	copy(b[:6], runID)
	n := keySeq.Add(1)
	for i := 35; i > 23 && n > 0; i-- {
		b[i] = "0123456789abcdef"[n&15]
		n >>= 4
	}
	return string(b[:])
}

// newMemEngine returns an engine on a fresh memstore that never fills up
// during a benchmark and starts no janitor.
func newMemEngine(tb testing.TB, opts ...idem.Option) (*idem.Engine, *memstore.Store) {
	tb.Helper()
	s := memstore.New(memstore.WithMaxRecords(1<<40), memstore.WithCleanupInterval(0))
	tb.Cleanup(func() { s.Close() })
	e, err := idem.New(s, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return e, s
}

// holdKey puts key in progress for a long lease, as a first request whose
// handler still runs, so that a request with key is answered 409.
func holdKey(tb testing.TB, s idem.Store, method, routeTemplate, path, key string) {
	tb.Helper()
	scoped := idem.ScopedKey(principal, method, routeTemplate, key)
	fp := idem.Fingerprint(method, path, "", "application/json", reqBody)
	if _, ok, err := s.Acquire(context.Background(), scoped, "holder", fp, time.Hour); err != nil || !ok {
		tb.Fatalf("hold key: acquired=%v err=%v", ok, err)
	}
}

// requireEnv returns the env var or skips (fails under CI=true).
func requireEnv(tb testing.TB, name string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s is not set (CI=true)", name)
		}
		tb.Skipf("%s is not set; run through make bench", name)
	}
	return v
}

// statusText is for failure messages.
func statusText(code int) string { return strconv.Itoa(code) + " " + http.StatusText(code) }
