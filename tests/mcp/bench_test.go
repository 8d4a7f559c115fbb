package mcp

import (
	"context"
	"strconv"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/adapters/idemmcp"
)

// BenchmarkCallTool measures one create_payment call over in-memory
// transports with the memory store: without idemmcp (no key), a first
// execution under a fresh key, and a replay.
func BenchmarkCallTool(b *testing.B) {
	ctx := context.Background()
	p := newPayments(false)
	s := newServer(p, newEngine(b, newMemStore(b)), idemmcp.WithScope(clientName), idemmcp.WithKeyOptional())
	cs := memorySession(b, s, "alice")
	b.Run("unprotected", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := call(ctx, cs, "create_payment", "", pay); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fresh", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if _, err := call(ctx, cs, "create_payment", "bench-"+strconv.Itoa(i)+"-"+b.Name(), pay); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_payment", Arguments: pay, Meta: mcp.Meta{idemmcp.MetaKey: "bench-replay"}}); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := call(ctx, cs, "create_payment", "bench-replay", pay); err != nil {
				b.Fatal(err)
			}
		}
	})
}
