package main

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestServeKfake runs kfake as a process of its own, as the package doc
// and README show (-serve-kfake), with a consumer against it that is
// SIGKILLed alone: kfake goes on serving the topic and its dead-letter
// topic, and a consumer started again (after the killed member's session,
// -kafka-session) handles the payments it publishes, one receipt each.
func TestServeKfake(t *testing.T) {
	// The docs show this way, the one tested here.
	for _, doc := range []string{"../../README.md", "main.go"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "go run ./examples/consumer -serve-kfake 9092") || !strings.Contains(string(b), "-kafka 127.0.0.1:9092") {
			t.Errorf("%s does not show kfake in a process of its own (go run ./examples/consumer -serve-kfake 9092, consumers with -kafka 127.0.0.1:9092)", doc)
		}
	}
	w := newWorld(t, "")
	t.Cleanup(func() {
		for _, table := range []string{w.name + "_events", w.name + "_events_partitions", w.name + "_payments"} {
			_, _ = w.pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{table}.Sanitize())
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a free port for kfake
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	kf := exec.Command(bin, "-serve-kfake", strconv.Itoa(port), "-name", w.name)
	addr := startUntil(t, kf, "kfake listening on ")
	if !strings.Contains(addr, "127.0.0.1:"+strconv.Itoa(port)) {
		t.Fatalf("kfake printed %q; want it listening on port %d", addr, port)
	}
	seed := "127.0.0.1:" + strconv.Itoa(port)
	base := []string{"-broker", "kafka", "-kafka", seed, "-name", w.name, "-kafka-session", "6s"}

	killed := exec.Command(bin, base...)
	startUntil(t, killed, "ready")
	if err := killed.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = killed.Wait()

	cl, err := kgo.NewClient(kgo.SeedBrokers(seed))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topics, err := kadm.NewClient(cl).ListTopics(ctxT(t))
	if err != nil {
		t.Fatalf("kfake after the consumer's SIGKILL: %v", err)
	}
	for _, topic := range []string{w.name, w.name + ".DLT"} {
		if !topics.Has(topic) {
			t.Fatalf("kfake has topics %v; want %s", topics.Names(), topic)
		}
	}

	again := exec.Command(bin, append(base, "-publish", "3", "-exit-idle", "10m")...)
	startUntil(t, again, "")
	defer func() { _ = again.Process.Signal(syscall.SIGTERM); _ = again.Wait() }()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var total, distinct int
		err := w.pool.QueryRow(ctxT(t), `SELECT count(*), count(DISTINCT payment_id) FROM `+pgx.Identifier{w.name + "_outbox"}.Sanitize()).Scan(&total, &distinct)
		if err == nil && distinct == 3 {
			if total != 3 {
				t.Fatalf("%d receipts for 3 payments", total)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted consumer made %d receipts of 3 within 3 minutes (%v)", distinct, err)
		}
	}
	if err := kf.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := kf.Wait(); err != nil {
		t.Fatalf("kfake after SIGTERM: %v", err)
	}
}

// startUntil starts cmd, stopped at the end of the test, and returns the
// first line of its stdout that starts with prefix (after at most two
// minutes); with prefix "" it returns at once. The rest of the output is
// read and dropped.
func startUntil(t *testing.T, cmd *exec.Cmd, prefix string) string {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		defer close(found)
		sent := prefix == ""
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if !sent && strings.HasPrefix(sc.Text(), prefix) {
				found <- sc.Text()
				sent = true
			}
		}
	}()
	if prefix == "" {
		return ""
	}
	select {
	case l, ok := <-found:
		if !ok {
			t.Fatalf("%v ended without printing %q", cmd.Args, prefix)
		}
		return l
	case <-time.After(2 * time.Minute):
		t.Fatalf("%v printed no %q within 2 minutes", cmd.Args, prefix)
	}
	return ""
}
