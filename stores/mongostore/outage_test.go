package mongostore_test

import (
	"bufio"
	"context"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/idemkit/idem/core/storetest"
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

// TestOutage kills a private FerretDB under a running store and starts it
// again on the same port (storetest.RunOutage). FerretDB keeps its data in
// a temporary directory, so the restarted server is empty.
func TestOutage(t *testing.T) {
	uri(t) // integration tests only
	if ferretBin == "" {
		t.Fatalf("no FerretDB binary (%s unset and the build failed): %v", envFerretDB, ferretBinErr)
	}
	storetest.RunOutage(t, func(t *testing.T) storetest.Outage {
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
		return storetest.Outage{
			Store:   store,
			Cut:     proc.kill,
			Restore: func() { startFerretDB(t, parsed.Host) },
			During: func(t *testing.T) {
				time.Sleep(150 * time.Millisecond) // the clock offset is now stale
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				if _, _, err := store.Get(ctx, storetest.Key()); err == nil || !strings.Contains(err.Error(), "mongostore:") {
					t.Fatalf("Get during the outage = %v; want a wrapped server error", err)
				}
				ctx, cancel = context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				if _, _, err := mongostore.New(coll).Get(ctx, storetest.Key()); err == nil || !strings.Contains(err.Error(), "server clock") {
					t.Fatalf("first operation of a new store during the outage = %v; want the clock read error", err)
				}
			},
		}
	})
}
