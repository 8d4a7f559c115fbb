package idemfiberv3_test

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

	"github.com/gofiber/fiber/v3"

	"github.com/idemkit/idem/adapters/idemfiberv3"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
)

// TestRunner: a request whose holder stopped and whose client never came
// back is run again by a Recoverer through the app in process
// (idemfiberv3.Runner), authenticated by the engine's hook as its stored
// principal; the client's late retry gets the answer replayed.
func TestRunner(t *testing.T) {
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	e, err := idem.New(adaptertest.CrashableRecoverable(store), idem.WithLogger(slog.New(slog.DiscardHandler)),
		idem.WithLease(time.Second), idem.WithStoreTimeout(250*time.Millisecond), idem.WithRecovery())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	app := newApp()
	app.Use(func(c fiber.Ctx) error { // authentication, with the recovery hook
		user, ok := e.RecoveryPrincipal(c.Get(idem.RecoveryHeader))
		if !ok {
			user = c.Get("X-User")
		}
		if user == "" {
			return c.SendStatus(http.StatusUnauthorized)
		}
		c.Locals("user", user)
		return c.Next()
	})
	var runs atomic.Int64
	var seen atomic.Pointer[string]
	release := make(chan struct{})
	app.Post("/pay", idemfiberv3.New(e, idemfiberv3.WithScope(func(c fiber.Ctx) string { s, _ := c.Locals("user").(string); return s })),
		func(c fiber.Ctx) error {
			n := runs.Add(1)
			v := c.Locals("user").(string) + "|" + string(c.Body())
			seen.Store(&v)
			if n == 1 {
				<-release // the holder stops here
			}
			return c.Status(http.StatusCreated).SendString("paid")
		})
	newReq := func() *http.Request {
		r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{"amount":5}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-User", "alice")
		r.Header.Set("Idempotency-Key", "pay-1")
		return r
	}
	var held sync.WaitGroup
	held.Add(1)
	go func() {
		defer held.Done()
		if resp, err := app.Test(newReq(), fiber.TestConfig{}); err == nil {
			resp.Body.Close()
		}
	}()
	t.Cleanup(held.Wait)
	t.Cleanup(func() { close(release) })
	for deadline := time.Now().Add(10 * time.Second); runs.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first request never reached the handler")
		}
	}
	rec, err := idem.NewRecoverer(e, idem.RecoverRequests(idemfiberv3.Runner(app)), idem.RecoverBackoff(50*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	adaptertest.RecoverOne(t, rec)
	if v := seen.Load(); v == nil || *v != `alice|{"amount":5}` || runs.Load() != 2 {
		t.Fatalf("the recovery run saw %v (runs %d); want alice and the body", v, runs.Load())
	}
	resp, err := app.Test(newReq(), fiber.TestConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated || string(body) != "paid" || resp.Header.Get(idem.ReplayedHeader) != "true" || runs.Load() != 2 {
		t.Fatalf("late retry: %d %q replayed %q, runs %d; want the recovery's 201 replayed", resp.StatusCode, body, resp.Header.Get(idem.ReplayedHeader), runs.Load())
	}
}
