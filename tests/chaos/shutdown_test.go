package chaos

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	tpclient "github.com/Shopify/toxiproxy/v2/client"

	idem "github.com/idemkit/idem/core"
)

// TestCloseWaitsOnlyForPendingWork fails one store call (an acquire while
// the proxy is down; a release whose reply is lost), then closes the
// engine: with nothing left to do in the store, Close returns nil, without
// waiting out its window and abandoning work that does not exist.
func TestCloseWaitsOnlyForPendingWork(t *testing.T) {
	const window = 10 * time.Second // generous: the only work is one release round trip
	t.Run("acquire-failed", func(t *testing.T) {
		t.Parallel()
		rig := newEngineRig(t, idem.WithStoreTimeout(300*time.Millisecond))
		req, _ := rig.request()
		rig.px.disable()
		if x, resp := rig.e.Begin(context.Background(), req); x != nil || resp == nil || resp.Status != http.StatusServiceUnavailable {
			t.Fatalf("store down: %v %+v, want 503", x, resp)
		}
		rig.px.enable()
		closeWithin(t, rig.e, window)
	})
	t.Run("release-reply-lost", func(t *testing.T) {
		t.Parallel()
		rig := newEngineRig(t, idem.WithStoreTimeout(300*time.Millisecond))
		req, scoped := rig.request()
		x := rig.begin(req)
		remove := rig.px.toxic("timeout", "downstream", tpclient.Attributes{"timeout": 0})
		x.Fail() // the release runs in Redis, its reply is dropped: retried in the background
		remove()
		rig.waitState(scoped, "") // released
		closeWithin(t, rig.e, window)
	})
}

func closeWithin(t *testing.T, e *idem.Engine, window time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	start := time.Now()
	if err := e.Close(ctx); err != nil {
		t.Fatalf("Close: %v after %v: it waited out its window for work that did not exist", err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("Close returned after %v", time.Since(start).Round(time.Millisecond))
}

// TestShutdownAfterStoreFailure is the same through an example service's
// SIGTERM path: one request refused while the store is unreachable, then a
// graceful stop logs no abandoned work.
func TestShutdownAfterStoreFailure(t *testing.T) {
	t.Parallel()
	be := redisBackend(t)
	px := newProxy(t, be.addr)
	a := startService(t, "nethttp", "", append(be.flags(px.Addr()), "-store-timeout", "300ms")...)
	px.disable()
	if ans := pay(a.URL, "u"+hexID(), newKey(), 1000); ans.status != http.StatusServiceUnavailable {
		t.Fatalf("store down: %v, want 503", ans)
	}
	px.enable()
	a.stop()
	if l := a.logs(); strings.Contains(l, "abandoned") {
		t.Errorf("a graceful stop after one failed store call abandoned work:\n%s", l)
	}
}
