package idemfiberv3_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/recover"

	"github.com/idemkit/idem/adapters/idemfiberv3"
	"github.com/idemkit/idem/tests/adapters/internal/client"
)

// v3's c.End() writes the response to the connection and closes it before
// the chain returns: what idemfiberv3 records afterwards is that response,
// and the retry gets it replayed; a retry that overtakes the recording gets
// 409 (in progress) first.
func TestEnd(t *testing.T) {
	var runs atomic.Int64
	app := newApp()
	app.Post("/end", idemfiberv3.New(client.Engine(t), idemfiberv3.WithScope(scope)), func(c fiber.Ctx) error {
		runs.Add(1)
		c.Set("Location", "/ended/1")
		if err := c.Status(201).SendString("ended"); err != nil {
			return err
		}
		return c.End()
	})
	url := serve(t, app) + "/end"
	first := client.Post(t, url, "k", `{}`)
	deadline := time.Now().Add(10 * time.Second)
	second := client.Post(t, url, "k", `{}`)
	for second.Status == 409 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		second = client.Post(t, url, "k", `{}`)
	}
	if first.Status != 201 || first.Body != "ended" || first.Replayed() {
		t.Fatalf("first: %d %q replayed=%v", first.Status, first.Body, first.Replayed())
	}
	if second.Status != 201 || second.Body != "ended" || !second.Replayed() || second.Header.Get("Location") != "/ended/1" || runs.Load() != 1 {
		t.Fatalf("retry: %d %q replayed=%v Location %q runs=%d", second.Status, second.Body, second.Replayed(), second.Header.Get("Location"), runs.Load())
	}
}

// A panic after c.End(): the client has the 201, so the key must not be
// released for a second execution; the retry gets 410
// "response-not-stored" (executed, not replayable).
func TestPanicAfterEnd(t *testing.T) {
	var runs atomic.Int64
	app := newApp()
	app.Use(recover.New())
	app.Post("/end", idemfiberv3.New(client.Engine(t), idemfiberv3.WithScope(scope)), func(c fiber.Ctx) error {
		runs.Add(1)
		if err := c.Status(201).SendString("charged"); err != nil {
			return err
		}
		if err := c.End(); err != nil {
			return err
		}
		panic("post-processing failed after the answer was sent")
	})
	url := serve(t, app) + "/end"
	if first := client.Post(t, url, "k", `{}`); first.Status != 201 || first.Body != "charged" {
		t.Fatalf("first: %d %q, want the 201 End sent", first.Status, first.Body)
	}
	deadline := time.Now().Add(10 * time.Second)
	retry := client.Post(t, url, "k", `{}`)
	for retry.Status == 409 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		retry = client.Post(t, url, "k", `{}`)
	}
	if retry.Status != 410 || runs.Load() != 1 {
		t.Fatalf("retry: %d %q after %d executions; want 410 response-not-stored and one execution", retry.Status, retry.Body, runs.Load())
	}
}
