package idemrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestRetryCodes: which codes a client retries, with and without a
// RetryInfo delay, and idem's answers by their reason whatever the code.
func TestRetryCodes(t *testing.T) {
	info := &errdetails.RetryInfo{RetryDelay: durationpb.New(2 * time.Second)}
	for _, c := range []struct {
		name    string
		code    uint32
		details []any
		retry   bool
	}{
		{"unavailable", idemrpc.Unavailable, nil, true},
		{"aborted", idemrpc.Aborted, nil, false},
		{"aborted with RetryInfo", idemrpc.Aborted, []any{info}, true},
		{"resource exhausted", idemrpc.ResourceExhausted, nil, false},
		{"resource exhausted with RetryInfo", idemrpc.ResourceExhausted, []any{info}, true},
		{"internal with RetryInfo", idemrpc.Internal, []any{info}, false},
		{"idem's body too large", idemrpc.ResourceExhausted, []any{&errdetails.ErrorInfo{Domain: idemrpc.ErrorDomain, Reason: idemrpc.Reason(idem.OutcomeBodyTooLarge)}, info}, false},
		{"idem's store unavailable", idemrpc.Unavailable, []any{&errdetails.ErrorInfo{Domain: idemrpc.ErrorDomain, Reason: idemrpc.Reason(idem.OutcomeUnavailable)}}, true},
	} {
		if _, retry, _ := idemrpc.Retry(c.code, c.details); retry != c.retry {
			t.Errorf("%s: retry %v, want %v", c.name, retry, c.retry)
		}
	}
}

// TestRetrierBudget: retries are bounded in time by default; a failure no
// retry fixes stops at once and is returned as it is; the error after
// giving up names the key and wraps the last one.
func TestRetrierBudget(t *testing.T) {
	ctx := context.Background()
	last := errors.New("connection refused")
	r := idemrpc.Budget{MaxElapsed: 50 * time.Millisecond, First: time.Millisecond, Max: time.Millisecond}.Start()
	n := 1
	for r.Again(ctx, last, idemrpc.Unavailable, nil, false) {
		n++
	}
	err := r.GaveUp(last, "k-1", `metadata "idempotency-key"`)
	var g *idemrpc.GaveUpError
	if !errors.As(err, &g) || g.Key != "k-1" || g.Attempts != n || !errors.Is(err, idemrpc.ErrOutOfTime) || !errors.Is(err, last) ||
		!strings.Contains(err.Error(), `resume by calling again with the same key (metadata "idempotency-key": "k-1")`) {
		t.Fatalf("after %d sends: %v", n, err)
	}
	if n < 2 {
		t.Errorf("gave up after %d send(s), want retries within the time budget", n)
	}

	dns := errors.New("dns: A record lookup error: lookup x.invalid: no such host")
	r = idemrpc.DefaultBudget.Start()
	if r.Again(ctx, dns, idemrpc.Unavailable, nil, false) || errors.As(r.GaveUp(dns, "k-2", ""), &g) {
		t.Fatal("a name not found was retried, or wrapped")
	}

	r = idemrpc.Budget{Attempts: 2, MaxElapsed: time.Minute, First: time.Millisecond, Max: time.Millisecond}.Start()
	if !r.Again(ctx, last, idemrpc.Unavailable, nil, false) || r.Again(ctx, last, idemrpc.Unavailable, nil, false) ||
		!errors.Is(r.GaveUp(last, "k-3", ""), idemrpc.ErrAttemptsExhausted) {
		t.Fatal("Attempts 2: want one retry, then attempts exhausted")
	}
}
