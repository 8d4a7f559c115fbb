package idemfiberv3_test

import (
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemkit/idem/adapters/idemfiberv3"
)

// v3's c.End() writes the response to the connection and closes it before
// the chain returns: what idemfiberv3 records afterwards is that response,
// and the retry gets it replayed.
func TestEnd(t *testing.T) {
	var runs atomic.Int64
	app := newApp()
	app.Post("/end", idemfiberv3.New(engine(t), idemfiberv3.WithScope(scope)), func(c fiber.Ctx) error {
		runs.Add(1)
		c.Set("Location", "/ended/1")
		if err := c.Status(201).SendString("ended"); err != nil {
			return err
		}
		return c.End()
	})
	url := serve(t, app) + "/end"
	first := post(t, url, "k", `{}`)
	second := post(t, url, "k", `{}`)
	if first.status != 201 || first.body != "ended" || replayed(first) {
		t.Fatalf("first: %d %q replayed=%v", first.status, first.body, replayed(first))
	}
	if second.status != 201 || second.body != "ended" || !replayed(second) || second.header.Get("Location") != "/ended/1" || runs.Load() != 1 {
		t.Fatalf("retry: %d %q replayed=%v Location %q runs=%d", second.status, second.body, replayed(second), second.header.Get("Location"), runs.Load())
	}
}
