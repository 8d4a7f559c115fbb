package benchmarks

import (
	"context"
	"flag"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/benchmarks/internal/harness"
	idem "github.com/idemkit/idem/core"
)

// full enables the heavy cases (10^6 preload, end-to-end processes); `make
// bench` sets it, `make test` (-benchtime=1x) does not.
var full = flag.Bool("bench.full", false, "run the heavy benchmarks: 10^6 preloaded records and end-to-end load against example processes")

// The shared case of every framework (internal/harness): request and
// response bodies, route, principal and keys.
var (
	reqBody  = harness.ReqBody
	respBody = harness.RespBody
)

const (
	route     = harness.Route
	principal = harness.Principal
)

// newMemEngine (an engine on a memstore that never fills up) and
// requireEnv (an environment variable, or skip) are harness's.
var (
	newMemEngine = harness.NewMemEngine
	requireEnv   = harness.RequireEnv
)

// newKey is harness.NewKey: a fresh UUID-shaped key, one allocation.
func newKey() string { return harness.NewKey() }

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

// statusText is for failure messages.
func statusText(code int) string { return strconv.Itoa(code) + " " + http.StatusText(code) }
