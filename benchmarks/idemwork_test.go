package benchmarks

import (
	"net/http"
	"testing"

	idem "github.com/idemkit/idem/core"
)

// sinkWork keeps BenchmarkIdemWork's results alive.
var sinkWork [2]string

// BenchmarkIdemWork times, alone, the hashing idem does on every request
// with a key and Fiber's built-in middleware skips: the scoped key
// (SHA-256 over principal, method, route and key) and the fingerprint
// (SHA-256 over method, path, query, media type and body), on the inputs
// of BenchmarkFiberPeer's requests. The engine computes both into one
// string (one allocation); idem.ScopedKey and idem.Fingerprint return one
// each, so this is an upper bound of what the engine pays for them.
// peer=<fiber>: the same work paired (chunks of 500, as BenchmarkFiberPeer)
// with one request through that Fiber's built-in middleware on the path,
// so hashes/builtin reads against BenchmarkFiberPeer's idem/builtin.
func BenchmarkIdemWork(b *testing.B) {
	key := newKey()
	hashes := func() error {
		sinkWork[0] = idem.ScopedKey(principal, http.MethodPost, route, key)
		sinkWork[1] = idem.Fingerprint(http.MethodPost, route, "", "application/json", reqBody)
		return nil
	}
	b.Run("work=scope+fingerprint", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = hashes()
		}
	})
	for _, peer := range []struct {
		name    string
		builtin func() driver
	}{{"fiber", newFiberBuiltin}, {"fiberv3", newFiberV3Builtin}} {
		for _, path := range []string{"fresh", "replay"} {
			b.Run("peer="+peer.name+"/path="+path, func(b *testing.B) {
				d := peer.builtin()
				if code := d.do(http.MethodPost, key); code != http.StatusCreated {
					b.Fatalf("first: %s", statusText(code))
				}
				request := func() error {
					k := key
					if path == "fresh" {
						k = newKey()
					}
					if code := d.do(http.MethodPost, k); code != http.StatusCreated {
						b.Fatalf("%s: %s", path, statusText(code))
					}
					return nil
				}
				paired(b, "hashes", "builtin", 0, hashes, request)
			})
		}
	}
}
