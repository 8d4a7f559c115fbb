package pgstore_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/pgstore"
)

// The crash tests run payment services as separate processes: the test
// binary itself, started with helperEnv set, serves POST /v1/payments on a
// pgstore Store and inserts one payment row per execution.
const helperEnv = "IDEM_PGSTORE_HELPER"

// helperConfig is how the test configures a helper process (environment).
type helperConfig struct {
	table, payments string
	lease           time.Duration
	noRenewal       bool // hide Extend from the engine: the lease is never renewed
	pause           bool // after the insert, wait for GET /continue (or SIGKILL)
	autocommit      bool // insert through the pool, outside the execution's transaction
}

func (c helperConfig) env() []string {
	return append(os.Environ(), helperEnv+"=1",
		"IDEM_POSTGRES_URL="+pgURL(), "H_TABLE="+c.table, "H_PAYMENTS="+c.payments, "H_LEASE="+c.lease.String(),
		fmt.Sprintf("H_NORENEWAL=%t", c.noRenewal), fmt.Sprintf("H_PAUSE=%t", c.pause), fmt.Sprintf("H_AUTOCOMMIT=%t", c.autocommit))
}

// helperMain is the helper process: it prints "listening <addr>", then
// "inserted <n>" after each execution's insert.
func helperMain() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "helper:", err); return 1 }
	lease, err := time.ParseDuration(os.Getenv("H_LEASE"))
	if err != nil {
		return fail(err)
	}
	pool, err := pgxpool.New(context.Background(), pgURL())
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	s := pgstore.New(pool, pgstore.WithTable(os.Getenv("H_TABLE")))
	var store idem.Store = s
	if os.Getenv("H_NORENEWAL") == "true" {
		store = struct {
			idem.Store
			idem.Transactional
		}{s, s}
	}
	e, err := idem.New(store, idem.WithLease(lease), idem.WithStoreTimeout(lease/4)) // the floor: lease >= 4 × store timeout
	if err != nil {
		return fail(err)
	}
	// Dial the pool's connection and prepare the acquire and complete
	// statements before listening, so that the first request's store
	// timeout (a quarter of the lease) is not spent setting them up on a
	// loaded machine.
	wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	warm := fmt.Sprintf("warm-up-%d", os.Getpid())
	if _, _, err := s.Acquire(wctx, warm, "warm-up", "fp", time.Minute); err != nil {
		cancel()
		return fail(err)
	}
	err = s.Complete(wctx, warm, "warm-up", []byte("warm-up"), time.Millisecond)
	cancel()
	if err != nil {
		return fail(err)
	}
	payments := os.Getenv("H_PAYMENTS")
	pause, autocommit := os.Getenv("H_PAUSE") == "true", os.Getenv("H_AUTOCOMMIT") == "true"
	proceed := make(chan struct{})
	var executions atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /continue", func(http.ResponseWriter, *http.Request) { close(proceed) })
	mux.HandleFunc("POST /v1/payments", func(w http.ResponseWriter, r *http.Request) {
		x, resp := e.BeginHTTP(r, "/v1/payments", r.Header.Get("X-Principal"))
		if resp != nil {
			resp.Send(w)
			return
		}
		ctx := x.WithInfo(r.Context())
		n := executions.Add(1)
		insert := `INSERT INTO ` + payments + ` (idem_key, amount) VALUES ($1, 4200)`
		var err error
		if autocommit {
			_, err = pool.Exec(ctx, insert, r.Header.Get("Idempotency-Key"))
		} else if tx, terr := pgstore.Tx(ctx); terr != nil {
			err = terr
		} else {
			_, err = tx.Exec(ctx, insert, r.Header.Get("Idempotency-Key"))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper: insert:", err)
			x.Finish(500, nil)
			w.WriteHeader(500)
			return
		}
		fmt.Printf("inserted %d\n", n)
		if pause {
			<-proceed
		}
		out := fmt.Appendf(nil, `{"id":"pay_%d_%d"}`, os.Getpid(), n)
		w.Header().Set("Content-Type", "application/json")
		x.Write(out)
		x.Finish(http.StatusCreated, w.Header())
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(out)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	return fail(http.Serve(ln, mux))
}

// helper is a running helper process.
type helper struct {
	cmd   *exec.Cmd
	url   string
	lines chan string // stdout lines after "listening"
}

func startHelper(t *testing.T, c helperConfig) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = c.env()
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, lines: make(chan string, 16)}
	done := make(chan struct{})
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done; _ = cmd.Wait() })
	go func() {
		defer close(done)
		defer close(h.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	line := h.next(t)
	addr, ok := strings.CutPrefix(line, "listening ")
	if !ok {
		t.Fatalf("helper said %q; want listening <addr>", line)
	}
	h.url = "http://" + addr
	return h
}

// next returns the helper's next output line, failing after retryBudget
// (a hang guard: a request to the helper may be retried that long).
func (h *helper) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-h.lines:
		if !ok {
			t.Fatal("helper exited")
		}
		return l
	case <-time.After(retryBudget):
		t.Fatalf("no output from the helper within %v", retryBudget)
	}
	return ""
}

// kill SIGKILLs the helper and waits until it is gone.
func (h *helper) kill(t *testing.T) {
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for range h.lines { // stdout closes when the process is gone
	}
}

// retryUntilExecuted retries key on url every 50ms, as a client retries
// idem's retryable answers (409 in progress, and 503 when a store call
// outran the store timeout on a loaded machine), until another answer
// or retryBudget; it returns that answer with the number of 409s before it.
func retryUntilExecuted(t *testing.T, client *http.Client, url, key string) (answer, int) {
	t.Helper()
	deadline := time.Now().Add(retryBudget)
	conflicts, unavailable := 0, 0
	for {
		a, err := post(client, url, key, `{"amount":4200}`)
		if err != nil {
			t.Fatal(err)
		}
		if !a.retryable() {
			if unavailable > 0 {
				t.Logf("%d answers were 503 store-unavailable, retried", unavailable)
			}
			return a, conflicts
		}
		if a.status == http.StatusConflict {
			conflicts++
		} else {
			unavailable++
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d (%d 409s, %d 503s) after %v", a.status, conflicts, unavailable, retryBudget)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// crash runs the crash proof: instance A inserts the payment row and is
// SIGKILLed before the completion; after its lease lapses a retry through
// instance B executes. It returns the payment rows for the key.
func crash(t *testing.T, autocommit bool) int {
	pool := newPool(t)
	_, table := newStore(t, pool)
	payments := createPayments(t, pool, table)
	// A 5s lease (1.25s store timeout) holds while the test kills A and
	// sends its first retry through B however loaded the machine is, so
	// that retry meets A's live lease.
	cfg := helperConfig{table: table, payments: payments, lease: 5 * time.Second, pause: true, autocommit: autocommit}
	a := startHelper(t, cfg)
	cfg.pause = false
	b := startHelper(t, cfg)
	client := &http.Client{Timeout: 2 * retryBudget} // a hang guard: A's request waits for the test
	defer client.CloseIdleConnections()
	key := "crash-" + storetest.Token()

	first := make(chan error, 1)
	go func() { _, _, err := postRetrying(client, a.url, key, `{"amount":4200}`); first <- err }()
	if l := a.next(t); l != "inserted 1" {
		t.Fatalf("A said %q; want inserted 1", l)
	}
	a.kill(t)
	if err := <-first; err == nil {
		t.Fatal("the killed instance answered")
	}
	won, conflicts := retryUntilExecuted(t, client, b.url, key)
	if won.status != http.StatusCreated || won.replayed {
		t.Fatalf("retry through B = %+v; want a 201 execution", won)
	}
	if conflicts == 0 {
		t.Error("the first retry executed at once: A's lease was not live after the kill")
	}
	if l := b.next(t); l != "inserted 1" {
		t.Fatalf("B said %q; want inserted 1", l)
	}
	if again, _, err := postRetrying(client, b.url, key, `{"amount":4200}`); err != nil || !again.replayed || again.body != won.body {
		t.Fatalf("retry after B completed = %+v, %v; want the replay of %q", again, err, won.body)
	}
	t.Logf("A killed after its insert; %d retries answered 409 until its lease lapsed; B executed once", conflicts)
	return countRows(t, pool, payments, key)
}

// TestCrashAfterInsert is the crash proof: the killed instance's insert
// was in its execution's transaction, which died with its connection, so
// the table holds exactly the retry's row.
func TestCrashAfterInsert(t *testing.T) {
	t.Parallel()
	if n := crash(t, false); n != 1 {
		t.Fatalf("%d payment rows after the crash and the retry; want exactly 1", n)
	}
}

// TestCrashAfterInsertAutocommit is the same crash with the insert made
// outside the execution's transaction, as with any store that cannot
// commit a handler's writes with its completion (Redis, MongoDB): the
// killed instance's row survives and the retry adds a second one. This is
// the window transactional completion closes.
func TestCrashAfterInsertAutocommit(t *testing.T) {
	t.Parallel()
	if n := crash(t, true); n != 2 {
		t.Fatalf("%d payment rows after the crash and the retry with autocommit writes; want 2 (the documented window)", n)
	}
}

// TestSlowHandlerWithoutRenewal: A's handler outlives its lease (renewal
// disabled); B takes the key over, executes and completes; then A's
// completion is refused and its transaction rolled back: one row, B's.
func TestSlowHandlerWithoutRenewal(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, table := newStore(t, pool)
	payments := createPayments(t, pool, table)
	cfg := helperConfig{table: table, payments: payments, lease: 2 * time.Second, noRenewal: true, pause: true}
	a := startHelper(t, cfg)
	cfg.pause = false
	b := startHelper(t, cfg)
	client := &http.Client{Timeout: 2 * retryBudget} // a hang guard: A's request waits for the test
	defer client.CloseIdleConnections()
	key := "slow-" + storetest.Token()

	type result struct {
		a   answer
		err error
	}
	first := make(chan result, 1)
	go func() { a, _, err := postRetrying(client, a.url, key, `{"amount":4200}`); first <- result{a, err} }()
	if l := a.next(t); l != "inserted 1" {
		t.Fatalf("A said %q; want inserted 1", l)
	}
	won, conflicts := retryUntilExecuted(t, client, b.url, key)
	if won.status != http.StatusCreated || won.replayed {
		t.Fatalf("takeover through B = %+v; want a 201 execution", won)
	}
	if n := countRows(t, pool, payments, key); n != 1 {
		t.Fatalf("%d rows after B completed (A still running); want B's 1", n)
	}
	res, err := http.Get(a.url + "/continue") // A's handler finishes now, long after its lease
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	r := <-first
	if r.err != nil {
		t.Fatal(r.err)
	}
	// A's client got A's own 201 (sent as the handler answered); what
	// counts is the database and what retries see.
	if n := countRows(t, pool, payments, key); n != 1 {
		t.Fatalf("%d payment rows after A's late completion; want 1 (A's commit refused)", n)
	}
	if again, _, err := postRetrying(client, a.url, key, `{"amount":4200}`); err != nil || !again.replayed || again.body != won.body {
		t.Fatalf("retry through A = %+v, %v; want the replay of B's %q", again, err, won.body)
	}
	t.Logf("B took over after %d 409s and executed; A's late completion was refused; A's client saw %s", conflicts, r.a.body)
}
