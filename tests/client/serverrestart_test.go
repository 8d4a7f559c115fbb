package client

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/client/idemclient"
	"github.com/idemkit/idem/core/adaptertest"
)

// payAt sends one payment of 1500 for user with key to the payments
// service at url through c, and returns its status and payment id.
func payAt(c *http.Client, url, user, key string) (status int, id string, replayed bool, err error) {
	req, err := http.NewRequestWithContext(idemclient.WithKey(context.Background(), key), http.MethodPost, url+"/v1/payments",
		strings.NewReader(`{"amount":1500,"currency":"eur"}`))
	if err != nil {
		return 0, "", false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", user)
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	var p struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(b, &p)
	return resp.StatusCode, p.ID, idemclient.Replayed(resp), err
}

// TestClientRidesOutServerRestart: a payment through idemclient with its
// default options, whose server process (examples/payments on Echo, Redis
// store, a 2s lease, a 3s provider call) is SIGKILLed mid-execution and
// started again on the same address after 2, 5 or 20 s, ends with the 201
// of the one execution that ran to its end: the restarted process's
// takeover (its /v1/stats counts one execution; a later call with the key
// gets that payment replayed). A server that never comes back ends the
// call at its time budget (WithMaxElapsed, short here) with a GaveUpError
// carrying the key.
func TestClientRidesOutServerRestart(t *testing.T) {
	t.Parallel()
	for _, down := range []time.Duration{2 * time.Second, 5 * time.Second, 20 * time.Second, -1} {
		name := "down " + down.String()
		if down < 0 {
			name = "never back"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := adaptertest.FreeAddr(t)
			url := "http://" + addr
			s := adaptertest.StartProcess(t, filepath.Join(binDir, "payments"), []string{"-framework", "echo", "-addr", addr,
				"-store", "redis", "-redis-url", redisURL(), "-redis-prefix", "idem-client-e2e:serverrestart:" + rand.Text()[:10] + ":",
				"-ttl", "10m", "-lease", "2s", "-store-timeout", "500ms", "-charge-latency", "3s"})
			svc := &service{t: t, name: "payments", URL: url}
			var opts []idemclient.Option
			if down < 0 {
				opts = append(opts, idemclient.WithMaxElapsed(3*time.Second))
			}
			c := &http.Client{Transport: idemclient.New(opts...)}
			t.Cleanup(c.CloseIdleConnections)
			user, key := "u-"+rand.Text()[:8], "pay-"+rand.Text()[:10]
			type outcome struct {
				status int
				id     string
				err    error
			}
			r := adaptertest.KillMidCall(t, s, down, func() bool { return svc.executions() > 0 }, func() outcome {
				status, id, _, err := payAt(c, url, user, key)
				return outcome{status, id, err}
			})
			if down < 0 {
				var g *idemclient.GaveUpError
				if !errors.As(r.err, &g) || g.Key != key || !errors.Is(r.err, idemclient.ErrOutOfTime) || !strings.Contains(r.err.Error(), "idemclient.WithKey(ctx, \""+key+"\")") {
					t.Fatalf("call to a server that never came back: %v; want out of time, naming key %q to resume with", r.err, key)
				}
				return
			}
			if r.err != nil || r.status != http.StatusCreated || r.id == "" {
				t.Fatalf("server down %v: the call ended with %d %q, %v; want 201 with a payment", down, r.status, r.id, r.err)
			}
			if n := svc.executions(); n != 1 {
				t.Fatalf("server down %v: the restarted server executed %d times, want 1 (the takeover)", down, n)
			}
			status, id, replayed, err := payAt(c, url, user, key)
			if err != nil || status != http.StatusCreated || id != r.id || !replayed {
				t.Fatalf("the key again: %d %q replayed %v, %v; want %s replayed", status, id, replayed, err, r.id)
			}
			t.Logf("server down %v: the call got 201 %s, the takeover's single execution", down, r.id)
		})
	}
}
