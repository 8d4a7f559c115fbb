package client

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	tpclient "github.com/Shopify/toxiproxy/v2/client"

	"github.com/idemkit/idem/client/idemclient"
)

// childEnv makes the test binary run child instead of the tests; the child
// reads its parameters from the other child* variables.
const (
	childEnv     = "IDEMCLIENT_E2E_CHILD"   // "stable": key from idemclient.Key; "random": idemclient's own
	childURL     = "IDEMCLIENT_E2E_URL"     // service (proxy) URL
	childUser    = "IDEMCLIENT_E2E_USER"    // X-User-ID, and the key's first part
	childOrder   = "IDEMCLIENT_E2E_ORDER"   // the key's second part
	childBackoff = "IDEMCLIENT_E2E_BACKOFF" // wait between attempts
)

// childResult is the last line a child prints: "result " + JSON.
type childResult struct {
	Status   int    `json:"status"`
	Replayed bool   `json:"replayed"`
	Key      string `json:"key"`
	Err      string `json:"err"`
}

// child is a client process paying 1500 for an order: it prints "attempt N"
// after each attempt and "result {...}" at the end.
func child() int {
	backoff, err := time.ParseDuration(os.Getenv(childBackoff))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c := &http.Client{Transport: idemclient.New(
		idemclient.WithBase(&http.Transport{DisableKeepAlives: true}),
		idemclient.WithBackoff(backoff, backoff),
		idemclient.WithMaxAttempts(1000),
		idemclient.WithMaxElapsed(time.Hour),
		idemclient.WithAttemptHook(func(a idemclient.Attempt) { fmt.Printf("attempt %d %v\n", a.N, a.Err) }),
	)}
	ctx := context.Background()
	if os.Getenv(childEnv) == "stable" {
		// The key from the caller's durable ids: the same after a restart.
		ctx = idemclient.WithKey(ctx, idemclient.Key(os.Getenv(childUser), os.Getenv(childOrder)))
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, os.Getenv(childURL)+"/v1/payments",
		strings.NewReader(`{"amount":1500,"currency":"eur"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", os.Getenv(childUser))
	var r childResult
	resp, err := c.Do(req)
	if err != nil {
		r.Err = err.Error()
	} else {
		_ = resp.Body.Close()
		r.Status, r.Replayed, r.Key = resp.StatusCode, idemclient.Replayed(resp), idemclient.RequestKey(resp)
	}
	b, _ := json.Marshal(r)
	fmt.Printf("result %s\n", b)
	return 0
}

// startChild runs this test binary as a client process; lines receives its
// stdout lines and is closed when it exits.
func startChild(t *testing.T, mode, url, user, order string, backoff time.Duration) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, childURL+"="+url, childUser+"="+user,
		childOrder+"="+order, childBackoff+"="+backoff.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_ = cmd.Wait()
		close(lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range lines { //nolint:revive // drain until the process is gone
		}
	})
	return cmd, lines
}

// killAfterFirstAttempt starts a client whose first attempt executes but
// loses its reply (every reply is reset), waits until that attempt failed
// and the client sleeps before its next one, and SIGKILLs it there.
func killAfterFirstAttempt(t *testing.T, px *tpclient.Proxy, svc *service, url, mode, user, order string, wantExecs int64) {
	t.Helper()
	if _, err := px.AddToxic("reset", "reset_peer", "downstream", 1, tpclient.Attributes{"timeout": 0}); err != nil {
		t.Fatal(err)
	}
	cmd, lines := startChild(t, mode, url, user, order, 10*time.Minute)
	timeout := time.After(60 * time.Second) // hang guard
	for waiting := true; waiting; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("client exited before its first attempt failed")
			}
			if strings.HasPrefix(l, "attempt 1 ") {
				if l == "attempt 1 <nil>" {
					t.Fatalf("the first attempt got a reply through a resetting proxy: %s", l)
				}
				waiting = false
			}
		case <-timeout:
			t.Fatal("no attempt within 60s")
		}
	}
	_ = cmd.Process.Kill() // between attempts: sleeping out its 10-minute backoff
	for range lines {
	}
	if n := svc.executions(); n != wantExecs {
		t.Fatalf("after the killed client: %d executions, want %d", n, wantExecs)
	}
	if err := px.RemoveToxic("reset"); err != nil {
		t.Fatal(err)
	}
}

// restartClient runs a client to its end and returns its result.
func restartClient(t *testing.T, mode, url, user, order string) childResult {
	t.Helper()
	_, lines := startChild(t, mode, url, user, order, 10*time.Millisecond)
	var r childResult
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return r
			}
			if j, found := strings.CutPrefix(l, "result "); found {
				if err := json.Unmarshal([]byte(j), &r); err != nil {
					t.Fatal(err)
				}
			}
		case <-timeout:
			t.Fatal("restarted client did not finish within 60s")
		}
	}
}

// TestRestart: a client process killed between attempts and restarted with
// the same idemclient.Key gets the first execution's answer replayed; the
// same crash with a random key executes the payment twice.
func TestRestart(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			svc := startService(t, "gin", "-store", store, "-redis-url", redisURL(),
				"-redis-prefix", "idem-client-e2e:restart:"+rand.Text()[:10]+":", "-ttl", "2m", "-charge-latency", "20ms")
			px, url := newProxy(t, svc.URL)
			user := "u-" + rand.Text()[:8]

			killAfterFirstAttempt(t, px, svc, url, "stable", user, "order-1", 1)
			r := restartClient(t, "stable", url, user, "order-1")
			if r.Status != http.StatusCreated || !r.Replayed || r.Key != idemclient.Key(user, "order-1") || r.Err != "" {
				t.Errorf("restarted client with the same key: %+v; want the 201 replayed", r)
			}
			if n := svc.executions(); n != 1 {
				t.Errorf("stable key: %d executions for one logical payment across a restart", n)
			}

			// The control: the same crash without a durable key.
			killAfterFirstAttempt(t, px, svc, url, "random", user, "order-2", 2)
			r = restartClient(t, "random", url, user, "order-2")
			if r.Status != http.StatusCreated || r.Replayed {
				t.Errorf("restarted client with a new key: %+v; want a fresh 201", r)
			}
			if n := svc.executions(); n != 3 {
				t.Errorf("random key: %d executions in all, want 3 (the crash made order-2 execute twice)", n)
			}
			svc.stop()
		})
	}
}
