package benchmarks

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem/benchmarks/internal/harness"
)

// paired is harness.Paired: the two sides alternate in chunks of 500.
var paired = harness.Paired

// BenchmarkFiberPeer is the same comparison as BenchmarkFiberBuiltin versus
// BenchmarkMiddleware/fw=fiber, with idem and the built-in middleware
// alternating in chunks of 500 requests within one benchmark: the ratio
// idem/builtin is immune to load drift between benchmarks.
func BenchmarkFiberPeer(b *testing.B) { benchPeer(b, "fiber", newFiberBuiltin) }

// benchPeer runs idem on framework fwName and that framework's own
// idempotency middleware (builtin) paired, on the fresh and replay paths.
func benchPeer(b *testing.B, fwName string, builtin func() driver) {
	var idemFW framework
	for _, fw := range frameworks {
		if fw.name == fwName {
			idemFW = fw
		}
	}
	for _, path := range []string{"fresh", "replay"} {
		b.Run("path="+path, func(b *testing.B) {
			e, _ := newMemEngine(b)
			ours, theirs := idemFW.build(e), builtin()
			key := newKey()
			for _, d := range []driver{ours, theirs} {
				if code := d.do(http.MethodPost, key); code != http.StatusCreated {
					b.Fatalf("first: %s", statusText(code))
				}
			}
			op := func(d driver) func() error {
				return func() error {
					k := key
					if path == "fresh" {
						k = newKey()
					}
					if code := d.do(http.MethodPost, k); code != http.StatusCreated {
						b.Fatalf("%s: %s", path, statusText(code))
					}
					return nil
				}
			}
			paired(b, "idem", "builtin", 0, op(ours), op(theirs))
		})
	}
}
