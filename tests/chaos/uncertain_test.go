package chaos

import (
	"context"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestUncertainAfterCrash SIGKILLs an instance mid-handler, after its
// payment row is written, under -uncertain-after-crash, on Redis (the row
// was committed on its own: takeover would write a second one, see
// TestRedisCrashAfterInsert) and on PostgreSQL (the row died with the
// execution's transaction). Retries through another instance get 409
// in-progress while the dead lease lives, then 409 operation-uncertain
// without Retry-After, and never execute. The operator checks the ledger
// and resolves the key with idemctl: on Redis the payment exists, so
// `complete` stores its answer and retries replay it; on PostgreSQL it does
// not, so `release` lets the next retry execute once. One row either way,
// and never a second execution without the operator.
func TestUncertainAfterCrash(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		r := startRedis(t)
		url := "redis://" + r.Addr() + "/0"
		uncertainAfterCrash(t, []string{"-store", "redis", "-redis-url", url}, func(_, _ string) []string { return []string{"-store", url} }, 1)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		uncertainAfterCrash(t, []string{"-store", "postgres"}, func(pg, schema string) []string {
			return []string{"-store", pg, "-table", schema + ".idem_records"}
		}, 0)
	})
}

// uncertainAfterCrash runs the scenario with the service's store flags and
// idemctl's, given the ledger's database and schema; rowsAfterCrash is the payment
// rows the killed instance leaves.
func uncertainAfterCrash(t *testing.T, store []string, ctlStore func(pgURL, schema string) []string, rowsAfterCrash int) {
	url, schema, pool := pgDatabase(t)
	args := append(store, "-postgres-url", url, "-postgres-schema", schema, "-payments-postgres",
		"-lease", "2s", "-store-timeout", "500ms", "-charge-latency", "0", "-uncertain-after-crash", "1h")
	a := startService(t, "nethttp", "", append(args, "-pause-after-record")...)
	b := startService(t, "nethttp", "", args...)
	user, key := "u"+hexID(), newKey()

	first := async(a.URL, user, key, 1000)
	a.waitPaused(1)
	a.kill()
	if ans := <-first; ans.err == nil {
		t.Fatalf("the killed instance answered %v", ans)
	}
	answers := retryUntil(b.URL, user, key, 1000, 50*time.Millisecond, 20*time.Second,
		func(a answer) bool { return a.status != http.StatusConflict || a.problem != "in-progress" })
	last := answers[len(answers)-1]
	if last.status != http.StatusConflict || last.problem != "operation-uncertain" || last.retry != "" {
		t.Fatalf("retries through B ended with %v (Retry-After %q); want 409 operation-uncertain without Retry-After; all: %v", last, last.retry, summary(answers))
	}
	for range 5 { // it stays uncertain: nothing executes without the operator
		time.Sleep(100 * time.Millisecond)
		if a := pay(b.URL, user, key, 1000); a.problem != "operation-uncertain" {
			t.Fatalf("a later retry got %v; want 409 operation-uncertain", a)
		}
	}
	if n := b.executions(); n != 0 {
		t.Fatalf("B executed %d times before the operator resolved the key", n)
	}
	if n := paymentRows(t, pool, schema, user); n != rowsAfterCrash {
		t.Fatalf("%d payment rows after the crash; want %d", n, rowsAfterCrash)
	}

	// The operator finds the key and resolves it from what the ledger says.
	ctlArgs := ctlStore(url, schema)
	out := idemctl(t, "", append([]string{"list"}, append(ctlArgs, "-state", "uncertain")...)...)
	m := regexp.MustCompile(`([0-9a-f]{64})  uncertain`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("idemctl list -state uncertain:\n%s\nwant the killed request's record", out)
	}
	if rowsAfterCrash == 1 { // charged: retries must get the charge's answer
		receipt := `{"id":"pay_by_operator","amount":1000,"currency":"eur"}`
		idemctl(t, receipt, append([]string{"complete"}, append(ctlArgs, "-status", "201", "-file", "-", "-header", "Content-Type: application/json", m[1])...)...)
		if a := pay(b.URL, user, key, 1000); a.status != http.StatusCreated || !a.replayed || a.id != "pay_by_operator" {
			t.Fatalf("retry after idemctl complete: %v id %q; want the replay of the operator's answer", a, a.id)
		}
		if n := b.executions(); n != 0 {
			t.Fatalf("B executed %d times after idemctl complete; want 0", n)
		}
	} else { // not charged: the retry executes, once
		idemctl(t, "", append([]string{"release"}, append(ctlArgs, "-yes", m[1])...)...)
		won := pay(b.URL, user, key, 1000)
		if won.status != http.StatusCreated || won.replayed {
			t.Fatalf("retry after idemctl release: %v; want 201 executed", won)
		}
		if a := pay(b.URL, user, key, 1000); !a.replayed || a.id != won.id {
			t.Fatalf("retry after the execution: %v id %q; want the replay of %q", a, a.id, won.id)
		}
		if n := b.executions(); n != 1 {
			t.Fatalf("B executed %d times after idemctl release; want 1", n)
		}
	}
	if n := paymentRows(t, pool, schema, user); n != 1 {
		t.Fatalf("%d payment rows at the end; want exactly 1", n)
	}
	t.Logf("killed mid-handler; retries through B: %v; resolved by the operator", summary(answers))
}

var (
	idemctlOnce sync.Once
	idemctlBin  string
	idemctlErr  error
)

// idemctl runs cmd/idemctl (built once) with args and stdin, fails the test
// unless it exits 0, and returns its stdout.
func idemctl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	idemctlOnce.Do(func() {
		idemctlBin = filepath.Join(tmpRoot, "idemctl")
		cmd := exec.Command("go", "build", "-o", idemctlBin, ".")
		cmd.Dir = filepath.Join("..", "..", "cmd", "idemctl")
		if out, err := cmd.CombinedOutput(); err != nil {
			idemctlErr = err
			t.Logf("go build cmd/idemctl:\n%s", out)
		}
	})
	if idemctlErr != nil {
		t.Fatalf("go build cmd/idemctl: %v", idemctlErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, idemctlBin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("idemctl %q: %v\n%s%s", args, err, out.String(), errOut.String())
	}
	return out.String()
}
