package main

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem/examples/internal/procs"
)

// TestFrameworkExamples runs each framework's short program
// (examples/<framework>, the one to copy) as its own process: an order
// sent again with its key is placed once (the retry gets the stored 201,
// replayed), keys are scoped per caller, a POST without a key is refused,
// and SIGTERM shuts the program down cleanly (exit status 0).
func TestFrameworkExamples(t *testing.T) {
	dir := t.TempDir()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, name := range procs.Frameworks {
		args = append(args, "github.com/idemkit/idem/examples/"+name)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, name := range procs.Frameworks {
		t.Run(name, func(t *testing.T) {
			logs, err := os.Create(filepath.Join(t.TempDir(), "service.log"))
			if err != nil {
				t.Fatal(err)
			}
			defer logs.Close()
			p, err := procs.Start(filepath.Join(dir, name), logs)
			if err != nil {
				t.Fatal(err)
			}
			stopped := false
			defer func() {
				if !stopped {
					p.Kill()
				}
				if t.Failed() {
					b, _ := os.ReadFile(logs.Name())
					t.Logf("log:\n%s", b)
				}
			}()
			d := &demo{url: p.URL, client: &http.Client{Timeout: 10 * time.Second}}
			key, order := newKey(), `{"sku":"book","quantity":2}`
			first := send(t, d, "POST", "/v1/orders", "alice", key, order)
			again := send(t, d, "POST", "/v1/orders", "alice", key, order)
			bob := send(t, d, "POST", "/v1/orders", "bob", key, order)
			if first.status != http.StatusCreated || !bytes.Contains(first.body, []byte(`"id":"ord_`)) {
				t.Fatalf("order: %d %s", first.status, first.body)
			}
			if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
				t.Errorf("retry: %d replayed=%q %s; want the stored answer %s", again.status, again.header.Get("Idempotent-Replayed"), again.body, first.body)
			}
			if bob.status != http.StatusCreated || bob.header.Get("Idempotent-Replayed") != "" || bytes.Equal(bob.body, first.body) {
				t.Errorf("another caller, same key: %d %s; want an order of its own", bob.status, bob.body)
			}
			if r := send(t, d, "POST", "/v1/orders", "alice", "", order); r.status != http.StatusBadRequest {
				t.Errorf("no Idempotency-Key: %d %s, want 400", r.status, r.body)
			}
			stopped = true
			p.Stop()
			if err := p.Exit(); err != nil {
				t.Errorf("after SIGTERM: %v, want a clean exit", err)
			}
		})
	}
}
