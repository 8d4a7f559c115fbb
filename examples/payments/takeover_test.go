package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/adapters/idemgrpc"
	"github.com/idemkit/idem/examples/grpc/gen/paymentsv1"
)

// instance is one process of this example.
type instance struct {
	cmd    *exec.Cmd
	addr   string      // grpc-go address
	lines  chan string // stdout after the address line
	client paymentsv1.PaymentsClient
}

// startInstance runs bin with args (which set its addresses) until the test
// ends, and connects a client to its grpc-go address.
func startInstance(t *testing.T, bin string, args ...string) *instance {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	in := &instance{cmd: cmd, lines: make(chan string, 16)}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "grpc listening on "); ok {
			in.addr = a
			break
		}
	}
	if in.addr == "" {
		t.Fatal("instance printed no grpc address")
	}
	go func() {
		for sc.Scan() {
			in.lines <- sc.Text()
		}
		close(in.lines)
	}()
	cc, err := grpc.NewClient("passthrough:///"+in.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	in.client = paymentsv1.NewPaymentsClient(cc)
	// Connect now (an unauthenticated call executes nothing), so that the
	// test's first call is not slowed by the handshake.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := in.client.CreatePayment(ctx, &paymentsv1.CreatePaymentRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("warm-up call: %v", err)
	}
	return in
}

// TestTakeoverAfterSIGKILL runs two instances on one Redis: instance A is
// SIGKILLed while its handler runs; the key stays in progress at B
// (Aborted with RetryInfo) until A's lease lapses, then B takes it over
// and executes it, once.
func TestTakeoverAfterSIGKILL(t *testing.T) {
	redisURL := os.Getenv("IDEM_REDIS_URL")
	if redisURL == "" {
		redisURL = "redis://127.0.0.1:6379/0"
	}
	bin := filepath.Join(t.TempDir(), "payments")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	args := []string{"-framework", "grpc", "-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0", "-store", "redis", "-redis-url", redisURL, "-redis-prefix", "idemtest:grpc:" + rand.Text()[:10] + ":",
		"-lease", "2s", "-store-timeout", "500ms", "-charge-latency", "3s"}
	a := startInstance(t, bin, args...)
	b := startInstance(t, bin, args...)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // hang guard
	defer cancel()
	charge := &paymentsv1.CreatePaymentRequest{Amount: 1200, Currency: "eur"}
	var call context.Context
	for held := false; !held; { // until A holds a key (B's probe may take it first: then another key)
		call = metadata.AppendToOutgoingContext(ctx, "x-user-id", "alice", "idempotency-key", rand.Text())
		go func() { _, _ = a.client.CreatePayment(call, charge) }() // dies with A
		for {
			_, err := b.client.CreatePayment(call, charge)
			if status.Code(err) == codes.Aborted {
				held = true
				break
			}
			if err == nil { // B executed it: start over with a new key
				break
			}
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("B before A acquired: %v", err)
			}
		}
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// At B: Aborted with RetryInfo until A's lease lapses, then B executes.
	var header metadata.MD
	_, err := b.client.CreatePayment(call, charge, grpc.Header(&header))
	if status.Code(err) != codes.Aborted {
		t.Fatalf("B right after the SIGKILL: %v, want Aborted (A's lease still runs)", err)
	}
	retrying, err := grpc.NewClient("passthrough:///"+b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithAttempts(20))))
	if err != nil {
		t.Fatal(err)
	}
	defer retrying.Close()
	if _, err := paymentsv1.NewPaymentsClient(retrying).CreatePayment(call, charge, grpc.Header(&header)); err != nil {
		t.Fatalf("B after the lease: %v", err)
	}
	if header.Get(idemgrpc.ReplayedMetadata) != nil {
		t.Fatal("B replayed: A's execution completed before the SIGKILL")
	}
	_, err = b.client.CreatePayment(call, charge, grpc.Header(&header))
	if err != nil || header.Get(idemgrpc.ReplayedMetadata) == nil {
		t.Fatalf("B's retry after its execution: %v, header %v, want a replay", err, header)
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	for l := range b.lines {
		if n, ok := strings.CutPrefix(l, "executions "); ok {
			t.Logf("B executed %s payments (probes that took a key first included)", n)
			return
		}
	}
	t.Fatal("B printed no executions line")
}

// TestShortGRPCExample runs examples/grpc, the short program to copy, as a
// process: a payment sent again with its key is executed once (the retry
// gets the same payment, replayed), and SIGTERM stops it cleanly.
func TestShortGRPCExample(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "grpc")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/idemkit/idem/examples/grpc").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	in := startInstance(t, bin, "-addr", "127.0.0.1:0")
	ctx := ctxFor(t, "alice", rand.Text())
	charge := &paymentsv1.CreatePaymentRequest{Amount: 1200, Currency: "eur"}
	var h1, h2 metadata.MD
	p1, err := in.client.CreatePayment(ctx, charge, grpc.Header(&h1))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := in.client.CreatePayment(ctx, charge, grpc.Header(&h2))
	if err != nil {
		t.Fatal(err)
	}
	if p1.GetId() == "" || p2.GetId() != p1.GetId() || h1.Get(idemgrpc.ReplayedMetadata) != nil || h2.Get(idemgrpc.ReplayedMetadata) == nil {
		t.Fatalf("payments %q then %q, replayed %v then %v; want one payment, the retry replayed", p1.GetId(), p2.GetId(),
			h1.Get(idemgrpc.ReplayedMetadata), h2.Get(idemgrpc.ReplayedMetadata))
	}
	if _, err := in.client.CreatePayment(ctxFor(t, "alice", rand.Text()), &paymentsv1.CreatePaymentRequest{Currency: "eur"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("amount 0: %v, want InvalidArgument", err)
	}
	if err := in.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range in.lines { // stdout ends when the program exits
	}
	if err := in.cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v, want a clean exit", err)
	}
}
