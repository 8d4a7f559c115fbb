package mcp

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/adapters/idemmcp"
	idem "github.com/idemkit/idem/core"
)

// Twenty agents send the same create_payment call with one key at once,
// over streamable HTTP: with the memory store to one server, with Redis to
// two server instances sharing it. The tool runs once; every agent gets
// its receipt, nineteen of them as a replay after in-progress answers.
func TestConcurrentDuplicatesHTTP(t *testing.T) {
	for _, kind := range []string{"memory", "redis"} {
		t.Run(kind, func(t *testing.T) {
			var ev events
			p := newPayments(true)
			defer p.open()
			var urls []string
			if kind == "memory" {
				urls = append(urls, serveHTTP(t, newServer(p, newEngine(t, newMemStore(t), ev.hook()))))
			} else {
				for _, s := range newRedisStores(t, 2) {
					urls = append(urls, serveHTTP(t, newServer(p, newEngine(t, s, ev.hook()))))
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			const n = 20
			key := idemmcp.NewKey()
			args := payment{AmountCents: 1250, Currency: "EUR", Payee: "acme"}
			results := make([]*mcp.CallToolResult, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				agent := httpAgent(t, urls[i%len(urls)], "alice", nil, idemmcp.WithAttempts(60), idemmcp.WithAttemptTimeout(time.Minute))
				wg.Go(func() {
					results[i], errs[i] = agent.CallTool(ctx, &mcp.CallToolParams{Name: "create_payment", Arguments: args, Meta: mcp.Meta{idemmcp.MetaKey: key}})
				})
			}
			// Every other agent is told "in progress" at least once
			// while the first execution waits at the gate.
			waitFor(t, "19 in-progress answers", func() bool { return ev.count(idem.EventConflict) >= n-1 })
			p.open()
			wg.Wait()
			if got := p.executions.Load(); got != 1 {
				t.Errorf("create_payment executed %d times, want 1", got)
			}
			fresh := 0
			for i := range n {
				if errs[i] != nil {
					t.Errorf("agent %d: %v", i, errs[i])
					continue
				}
				if r := receiptOf(t, results[i]); r.ID != "pay_1_acme" || r.AmountCents != 1250 {
					t.Errorf("agent %d: receipt %+v, want pay_1_acme for 1250", i, r)
				}
				if !replayed(results[i]) {
					fresh++
				}
			}
			if fresh != 1 {
				t.Errorf("%d results without the replay marker, want 1 (the execution's own)", fresh)
			}
		})
	}
}

// The connection is cut while create_payment runs: the agent's helper
// reconnects and sends the call again with the same key, is told the call
// is in progress, and then gets the first execution's stored result. The
// tool runs once.
func TestRetryAfterCutConnection(t *testing.T) {
	for _, kind := range []string{"memory", "redis"} {
		t.Run(kind, func(t *testing.T) {
			var ev events
			p := newPayments(true)
			defer p.open()
			store := newMemStore(t)
			if kind == "redis" {
				store = newRedisStores(t, 1)[0]
			}
			url := serveHTTP(t, newServer(p, newEngine(t, store, ev.hook())))
			var c cutter
			agent := httpAgent(t, url, "alice", c.dial, idemmcp.WithAttempts(60), idemmcp.WithAttemptTimeout(time.Minute), idemmcp.WithBackoff(20*time.Millisecond, 200*time.Millisecond))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			type outcome struct {
				res *mcp.CallToolResult
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := agent.CallTool(ctx, &mcp.CallToolParams{Name: "create_payment", Arguments: payment{AmountCents: 990, Currency: "EUR", Payee: "globex"}})
				done <- outcome{res, err}
			}()
			select {
			case <-p.started:
			case <-ctx.Done():
				t.Fatal("create_payment never started")
			}
			c.cut() // the response to the first attempt is lost
			waitFor(t, "a retry answered in-progress", func() bool { return ev.count(idem.EventConflict) >= 1 })
			p.open()
			o := <-done
			if o.err != nil {
				t.Fatalf("CallTool: %v", o.err)
			}
			if !replayed(o.res) {
				t.Error("the retry's result carries no replay marker")
			}
			if r := receiptOf(t, o.res); r.ID != "pay_1_globex" || r.AmountCents != 990 {
				t.Errorf("receipt %+v, want pay_1_globex for 990", r)
			}
			if got := p.executions.Load(); got != 1 {
				t.Errorf("create_payment executed %d times, want 1", got)
			}
		})
	}
}

// Keys are scoped by the TokenInfo's user: the same key sent by two users
// names two calls; each user's retry gets their own result.
func TestScopeByTokenUser(t *testing.T) {
	p := newPayments(false)
	url := serveHTTP(t, newServer(p, newEngine(t, newMemStore(t))))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := idemmcp.NewKey()
	params := func(payee string) *mcp.CallToolParams {
		return &mcp.CallToolParams{Name: "create_payment", Arguments: payment{AmountCents: 5, Currency: "EUR", Payee: payee}, Meta: mcp.Meta{idemmcp.MetaKey: key}}
	}
	ids := map[string]string{}
	for _, user := range []string{"alice", "bob", "alice", "bob"} {
		res, err := httpAgent(t, url, user, nil).CallTool(ctx, params(user))
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		id := receiptOf(t, res).ID
		if prev, ok := ids[user]; ok && prev != id {
			t.Errorf("%s's retry got %s, want their own %s", user, id, prev)
		}
		ids[user] = id
	}
	if got := p.executions.Load(); got != 2 {
		t.Errorf("executions = %d, want 2 (one per user)", got)
	}
}
