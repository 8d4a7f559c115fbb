package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/adapters/idemmcp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/redisstore"
)

var pay = payment{AmountCents: 700, Currency: "EUR", Payee: "initech"}

// A read-only tool is untouched: called without a key it runs every time
// and the engine sees nothing.
func TestReadOnlyUntouched(t *testing.T) {
	var ev events
	p := newPayments(false)
	cs := memorySession(t, newServer(p, newEngine(t, newMemStore(t), ev.hook()), idemmcp.WithScope(clientName)), "alice")
	ctx := context.Background()
	for range 3 {
		res, err := call(ctx, cs, "get_balance", "", nil)
		if err != nil || res.IsError {
			t.Fatalf("get_balance: %v %+v", err, res)
		}
		if replayed(res) {
			t.Error("get_balance's result carries the replay marker")
		}
	}
	if got := p.reads.Load(); got != 3 {
		t.Errorf("get_balance ran %d times, want 3", got)
	}
	// Even with a key it runs every time.
	for range 2 {
		if _, err := call(ctx, cs, "get_balance", "k-read", nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.reads.Load(); got != 5 {
		t.Errorf("get_balance ran %d times, want 5", got)
	}
	if n := ev.total(); n != 0 {
		t.Errorf("the engine saw %d events for a read-only tool, want 0", n)
	}
}

// A mutating tool without a key is refused and does not run; with
// WithKeyOptional it runs unprotected each time. Keys that are not strings
// of 1 to 255 bytes are refused.
func TestKeyMissingAndMalformed(t *testing.T) {
	ctx := context.Background()
	p := newPayments(false)
	cs := memorySession(t, newServer(p, newEngine(t, newMemStore(t)), idemmcp.WithScope(clientName)), "alice")
	_, err := call(ctx, cs, "create_payment", "", pay)
	var we *jsonrpc.Error
	if d, ok := idemmcp.ErrorDataOf(err); !ok || d.Type != idemmcp.TypeKeyMissing || d.Retryable {
		t.Errorf("no key: %v (data %+v), want %s, not retryable", err, d, idemmcp.TypeKeyMissing)
	} else if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams {
		t.Errorf("no key: %v, want code %d", err, jsonrpc.CodeInvalidParams)
	}
	for _, bad := range []any{"", 42, string(make([]byte, idem.MaxKeyLength+1))} {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_payment", Arguments: pay, Meta: mcp.Meta{idemmcp.MetaKey: bad}})
		if got := errorType(err); got != idemmcp.TypeKeyMalformed {
			t.Errorf("key %.20v: %v, want %s", bad, err, idemmcp.TypeKeyMalformed)
		}
	}
	if got := p.executions.Load(); got != 0 {
		t.Errorf("create_payment ran %d times without a usable key, want 0", got)
	}

	p2 := newPayments(false)
	cs2 := memorySession(t, newServer(p2, newEngine(t, newMemStore(t)), idemmcp.WithScope(clientName), idemmcp.WithKeyOptional()), "alice")
	for range 2 {
		if _, err := call(ctx, cs2, "create_payment", "", pay); err != nil {
			t.Fatal(err)
		}
	}
	if got := p2.executions.Load(); got != 2 {
		t.Errorf("WithKeyOptional: create_payment ran %d times without a key, want 2", got)
	}
}

// The same arguments, written differently (member order, whitespace,
// string escapes), are the same call: replayed. Other arguments under the
// same key are refused and do not run. The key may also come from a tool
// argument named with WithKeyArgument.
func TestArgumentsChanged(t *testing.T) {
	ctx := context.Background()
	p := newPayments(false)
	cs := memorySession(t, newServer(p, newEngine(t, newMemStore(t)), idemmcp.WithScope(clientName), idemmcp.WithKeyArgument("idempotency_key")), "alice")
	first, err := call(ctx, cs, "create_payment", "k-args", json.RawMessage(`{"amount_cents":700,"currency":"EUR","payee":"initech"}`))
	if err != nil {
		t.Fatal(err)
	}
	same, err := call(ctx, cs, "create_payment", "k-args", json.RawMessage(`{ "payee": "\u0069nitech", "currency": "EUR",  "amount_cents": 700 }`))
	if err != nil {
		t.Fatal(err)
	}
	if !replayed(same) || receiptOf(t, same) != receiptOf(t, first) {
		t.Errorf("same arguments reordered: replayed %v, receipt %+v, want the replay of %+v", replayed(same), receiptOf(t, same), receiptOf(t, first))
	}
	_, err = call(ctx, cs, "create_payment", "k-args", payment{AmountCents: 70000, Currency: "EUR", Payee: "initech"})
	d, ok := idemmcp.ErrorDataOf(err)
	if !ok || d.Type != idemmcp.TypeConflict || d.IdempotencyKey != "k-args" || d.Retryable {
		t.Errorf("changed amount: %v (data %+v), want %s for k-args, not retryable", err, d, idemmcp.TypeConflict)
	}
	// The same key on another tool is another call.
	if _, err := call(ctx, cs, "decline_payment", "k-args", pay); err != nil {
		t.Fatal(err)
	}
	if got := p.executions.Load(); got != 2 {
		t.Errorf("executions = %d, want 2 (create_payment once, decline_payment once)", got)
	}
	// Key in an argument: the retry is replayed, changed arguments refused.
	args := map[string]any{"amount_cents": 5, "currency": "EUR", "payee": "hooli", "idempotency_key": "k-in-args"}
	for range 2 {
		if _, err := call(ctx, cs, "create_payment", "", args); err != nil {
			t.Fatal(err)
		}
	}
	args["amount_cents"] = 6
	if _, err := call(ctx, cs, "create_payment", "", args); errorType(err) != idemmcp.TypeConflict {
		t.Errorf("key argument, changed amount: %v, want %s", err, idemmcp.TypeConflict)
	}
	if got := p.executions.Load(); got != 3 {
		t.Errorf("executions = %d, want 3", got)
	}
}

// Without a principal a call is refused, unless the engine has
// idem.WithGlobalScope; principals from WithScope separate keys.
func TestPrincipal(t *testing.T) {
	ctx := context.Background()
	p := newPayments(false)
	cs := memorySession(t, newServer(p, newEngine(t, newMemStore(t))), "alice")
	if _, err := call(ctx, cs, "create_payment", "k-p", pay); errorType(err) != idemmcp.TypeNoPrincipal {
		t.Errorf("no principal: %v, want %s", err, idemmcp.TypeNoPrincipal)
	}
	if got := p.executions.Load(); got != 0 {
		t.Errorf("create_payment ran %d times without a principal, want 0", got)
	}
	global := newServer(p, newEngine(t, newMemStore(t), idem.WithGlobalScope()))
	for _, user := range []string{"alice", "bob"} {
		if _, err := call(ctx, memorySession(t, global, user), "create_payment", "k-p", pay); err != nil {
			t.Fatalf("global scope: %v", err)
		}
	}
	if got := p.executions.Load(); got != 1 {
		t.Errorf("global scope: executions = %d, want 1 (one scope for all)", got)
	}
	scoped := newServer(p, newEngine(t, newMemStore(t)), idemmcp.WithScope(clientName))
	for _, user := range []string{"alice", "bob", "alice"} {
		if _, err := call(ctx, memorySession(t, scoped, user), "create_payment", "k-p", pay); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.executions.Load(); got != 3 {
		t.Errorf("WithScope: executions = %d, want 3 (one more per principal)", got)
	}
}

// A result with isError is stored and replayed (SEP-3182); with
// WithReleaseToolErrors the retry runs the tool again.
func TestToolErrors(t *testing.T) {
	ctx := context.Background()
	for _, release := range []bool{false, true} {
		p := newPayments(false)
		opts := []idemmcp.Option{idemmcp.WithScope(clientName)}
		if release {
			opts = append(opts, idemmcp.WithReleaseToolErrors())
		}
		cs := memorySession(t, newServer(p, newEngine(t, newMemStore(t)), opts...), "alice")
		var texts []string
		for range 2 {
			res, err := call(ctx, cs, "decline_payment", "k-err", pay)
			if err != nil || !res.IsError {
				t.Fatalf("decline_payment: %v %+v, want an isError result", err, res)
			}
			texts = append(texts, res.Content[0].(*mcp.TextContent).Text)
			if replayed(res) == release && len(texts) == 2 {
				t.Errorf("release %v: second result replayed = %v", release, replayed(res))
			}
		}
		want := int64(1)
		if release {
			want = 2
		}
		if got := p.executions.Load(); got != want {
			t.Errorf("release %v: executions = %d, want %d", release, got, want)
		}
		if !release && texts[0] != texts[1] {
			t.Errorf("replayed error %q, want the stored %q", texts[1], texts[0])
		}
	}
}

// A retry after the result's retention, while the engine keeps a
// tombstone, is refused as expired and does not run.
func TestKeyExpired(t *testing.T) {
	ctx := context.Background()
	p := newPayments(false)
	store := memstore.New(memstore.WithCleanupInterval(10 * time.Millisecond))
	t.Cleanup(func() { _ = store.Close() })
	e := newEngine(t, store, idem.WithRetention(200*time.Millisecond), idem.WithTombstones(time.Minute))
	cs := memorySession(t, newServer(p, e, idemmcp.WithScope(clientName)), "alice")
	if _, err := call(ctx, cs, "create_payment", "k-exp", pay); err != nil {
		t.Fatal(err)
	}
	var err error
	waitFor(t, "the result to expire", func() bool {
		_, err = call(ctx, cs, "create_payment", "k-exp", pay)
		return err != nil
	})
	if d, _ := idemmcp.ErrorDataOf(err); d.Type != idemmcp.TypeKeyExpired || d.Retryable {
		t.Errorf("after retention: %v (data %+v), want %s, not retryable", err, d, idemmcp.TypeKeyExpired)
	}
	if got := p.executions.Load(); got != 1 {
		t.Errorf("executions = %d, want 1", got)
	}
}

// A call whose earlier execution's holder stopped without recording an
// outcome (its lease lapsed in Redis, as after a crash) is refused as
// uncertain under idem.WithUncertainAfterCrash, and does not run.
func TestUncertain(t *testing.T) {
	ctx := context.Background()
	p := newPayments(false)
	store := newRedisStores(t, 1)[0]
	e := newEngine(t, store, idem.WithUncertainAfterCrash(time.Minute))
	cs := memorySession(t, newServer(p, e, idemmcp.WithScope(clientName)), "alice")
	args := []byte(`{"amount_cents":700,"currency":"EUR","payee":"initech"}`)
	// The record a crashed holder leaves: the key taken, its lease lapsed.
	payload := idem.JSONFingerprint().Fingerprint("tools/call", "create_payment", "", "application/json", args)
	scoped := idem.ScopedKey("alice", "(do)", idemmcp.OperationPrefix+"create_payment", "k-crash")
	fp := idem.Fingerprint("(do)", idemmcp.OperationPrefix+"create_payment", "", "", []byte(payload))
	keeper := store.(idem.Keeper)
	if _, ok, err := keeper.AcquireKeep(ctx, scoped, "crashed-holder", fp, 100*time.Millisecond, idem.Keep{Uncertain: time.Minute}); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	var err error
	waitFor(t, "the lease to lapse", func() bool {
		_, err = call(ctx, cs, "create_payment", "k-crash", json.RawMessage(args))
		return errorType(err) != idemmcp.TypeInProgress
	})
	if d, _ := idemmcp.ErrorDataOf(err); d.Type != idemmcp.TypeUncertain || d.Retryable {
		t.Errorf("lapsed lease: %v (data %+v), want %s, not retryable", err, d, idemmcp.TypeUncertain)
	}
	if got := p.executions.Load(); got != 0 {
		t.Errorf("executions = %d, want 0", got)
	}
}

// With the store unreachable the tool does not run and the answer says a
// retry with the same key is safe.
func TestStoreUnavailable(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	p := newPayments(false)
	cs := memorySession(t, newServer(p, newEngine(t, redisstore.New(c)), idemmcp.WithScope(clientName)), "alice")
	_, err = call(ctx, cs, "create_payment", "k-down", pay)
	if d, _ := idemmcp.ErrorDataOf(err); d.Type != idemmcp.TypeStoreUnavailable || !d.Retryable || d.RetryAfterSeconds < 1 {
		t.Errorf("store down: %v (data %+v), want %s, retryable", err, d, idemmcp.TypeStoreUnavailable)
	}
	if got := p.executions.Load(); got != 0 {
		t.Errorf("executions = %d, want 0", got)
	}
}

// The middleware refuses to be built guarding nothing.
func TestMiddlewareWithoutTools(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Middleware without tools did not panic")
		}
	}()
	idemmcp.Middleware(newEngine(t, newMemStore(t)), idemmcp.WithTools(&mcp.Tool{Name: "get", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}))
}

// A duplicate sent while the first call runs is refused at once with a
// retryable in-progress error (SEP-3182: not run, not blocked); once the
// first call ends, the same call gets its stored result.
func TestInProgress(t *testing.T) {
	ctx := context.Background()
	p := newPayments(true)
	defer p.open()
	s := newServer(p, newEngine(t, newMemStore(t)), idemmcp.WithScope(clientName))
	first := make(chan error, 1)
	cs1 := memorySession(t, s, "alice")
	go func() {
		_, err := call(ctx, cs1, "create_payment", "k-busy", pay)
		first <- err
	}()
	<-p.started
	cs := memorySession(t, s, "alice")
	_, err := call(ctx, cs, "create_payment", "k-busy", pay)
	var we *jsonrpc.Error
	d, ok := idemmcp.ErrorDataOf(err)
	if !ok || d.Type != idemmcp.TypeInProgress || !d.Retryable || d.RetryAfterSeconds != 1 || d.IdempotencyKey != "k-busy" {
		t.Errorf("duplicate in flight: %v (data %+v), want %s, retryable after 1 s", err, d, idemmcp.TypeInProgress)
	} else if !errors.As(err, &we) || we.Code != jsonrpc.CodeInternalError {
		t.Errorf("duplicate in flight: %v, want code %d", err, jsonrpc.CodeInternalError)
	}
	p.open()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	res, err := call(ctx, cs, "create_payment", "k-busy", pay)
	if err != nil || !replayed(res) || receiptOf(t, res).ID != "pay_1_initech" {
		t.Errorf("after the first call: %v, replayed %v, want the replay of pay_1_initech", err, res != nil && replayed(res))
	}
	if got := p.executions.Load(); got != 1 {
		t.Errorf("executions = %d, want 1", got)
	}
}
