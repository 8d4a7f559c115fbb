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
func BenchmarkIdemWork(b *testing.B) {
	key := newKey()
	b.Run("work=scope+fingerprint", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sinkWork[0] = idem.ScopedKey(principal, http.MethodPost, route, key)
			sinkWork[1] = idem.Fingerprint(http.MethodPost, route, "", "application/json", reqBody)
		}
	})
}
