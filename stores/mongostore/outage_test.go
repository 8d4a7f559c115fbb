package mongostore_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mongostore"
)

// ferretProc is a FerretDB process started by a test.
type ferretProc struct {
	cmd     *exec.Cmd
	drained chan struct{}
}

// startFerretDB starts the FerretDB binary on addr and returns its URI once it
// accepts connections.
func startFerretDB(t *testing.T, addr string) (string, *ferretProc) {
	t.Helper()
	cmd := exec.Command(ferretBin, "-addr", addr)
	// Its data directory goes under the test's temporary directory, so a
	// killed server leaves nothing behind.
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start FerretDB: %v", err)
	}
	p := &ferretProc{cmd: cmd, drained: make(chan struct{})}
	t.Cleanup(p.kill)
	line := make(chan string, 1)
	go func() {
		defer close(p.drained)
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case u := <-line:
		return u, p
	case <-time.After(20 * time.Second):
		t.Fatalf("FerretDB on %s printed no URI within 20s", addr)
	case <-p.drained:
		t.Fatalf("FerretDB on %s exited before accepting connections", addr)
	}
	return "", nil
}

// kill crashes the server (SIGKILL: a graceful stop waits seconds for the
// clients' pooled connections) and waits for it; safe to call twice.
func (p *ferretProc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.drained
	_ = p.cmd.Wait()
}

// TestOutage stops the server under a running engine: Begin answers 503 and
// executes nothing; once the server is back on the same port, the same
// engine and client recover without a restart. FerretDB keeps its data in a
// temporary directory, so the restarted server is empty.
func TestOutage(t *testing.T) {
	uri(t) // integration tests only
	if ferretBin == "" {
		t.Fatalf("no FerretDB binary (%s unset and the build failed): %v", envFerretDB, ferretBinErr)
	}
	u, proc := startFerretDB(t, "127.0.0.1:0")
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	client, err := mongo.Connect(options.Client().ApplyURI(u).
		SetServerSelectionTimeout(300 * time.Millisecond).
		SetConnectTimeout(300 * time.Millisecond).
		SetHeartbeatInterval(500 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Disconnect(ctx)
	})
	// A short clock refresh makes the operations during the outage go
	// through a failing clock refresh too.
	coll := client.Database(testDB).Collection("outage")
	store := mongostore.New(coll, mongostore.WithClockRefresh(100*time.Millisecond))
	e, err := idem.New(store, idem.WithStoreTimeout(time.Second), idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // stop the background releases of acquires that failed during the outage
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = e.Close(ctx)
	})
	executions := map[string]int{}
	run := func(key string) *idem.Response {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		x, resp := e.Begin(ctx, payment(key, `{"amount":5}`))
		if resp != nil {
			return resp
		}
		executions[key]++
		_, _ = x.Write([]byte(`{"ok":true}`))
		x.Finish(http.StatusCreated, http.Header{"Content-Type": {"application/json"}})
		return nil
	}

	if resp := run("before"); resp != nil {
		t.Fatalf("before the outage: %d %s; want executed", resp.Status, resp.Body)
	}
	t0 := time.Now()
	proc.kill()
	t.Logf("killed the server in %v", time.Since(t0).Round(time.Millisecond))

	time.Sleep(150 * time.Millisecond) // the clock offset is now stale
	start := time.Now()
	resp := run("during")
	if resp == nil || resp.Status != http.StatusServiceUnavailable {
		t.Fatalf("during the outage: %+v; want 503", resp)
	}
	if executions["during"] != 0 {
		t.Fatal("a request executed while the store was down")
	}
	if d := time.Since(start); d > 10*time.Second { // bounded by the store timeout (1s); slack for a loaded machine
		t.Errorf("503 took %v; want it bounded by the store timeout (1s)", d)
	}
	if _, _, err := store.Get(context.Background(), "during"); err == nil || !strings.Contains(err.Error(), "mongostore:") {
		t.Fatalf("Get during the outage = %v; want a wrapped server error", err)
	}
	if resp := run("during"); resp == nil || resp.Status != http.StatusServiceUnavailable {
		t.Fatalf("retry during the outage: %+v; want 503", resp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, _, err := mongostore.New(coll).Get(ctx, "during"); err == nil || !strings.Contains(err.Error(), "server clock") {
		t.Fatalf("first operation of a new store during the outage = %v; want the clock read error", err)
	}

	t0 = time.Now()
	startFerretDB(t, parsed.Host)
	t.Logf("restarted the server in %v", time.Since(t0).Round(time.Millisecond))
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp := run("during")
		if resp == nil {
			break
		}
		if resp.Status != http.StatusServiceUnavailable {
			t.Fatalf("after the restart: %d %s; want executed (or 503 while reconnecting)", resp.Status, resp.Body)
		}
		if time.Now().After(deadline) {
			t.Fatal("the engine still answers 503 20s after the server came back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("recovered %v after the restart", time.Since(t0).Round(time.Millisecond))
	if resp := run("during"); resp == nil || resp.Status != http.StatusCreated || !resp.IsReplay() {
		t.Fatalf("duplicate after recovery: %+v; want a replay", resp)
	}
	if executions["during"] != 1 || executions["before"] != 1 {
		t.Fatalf("executions = %v; want exactly one per key", executions)
	}
}
