package idemfiberv3_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"

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
