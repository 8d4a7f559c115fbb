package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemui"
	"github.com/idemkit/idem/stores/memstore"
)

// BenchmarkPagesMillion measures the console's pages on a memstore of a
// million in-progress records (1 in 1,000 of them acquired under Keep.Uncertain): each
// listing reads one bounded page through the store's cursor, however
// many records the store holds.
//
//	cd tests/console && go test -run X -bench PagesMillion -benchtime 20x .
const benchRecords = 1_000_000

func BenchmarkPagesMillion(b *testing.B) {
	ctx := context.Background()
	s := memstore.New(memstore.WithCleanupInterval(0))
	defer func() { _ = s.Close() }()
	var some string
	for i := range benchRecords {
		key := fmt.Sprintf("%064x", i*7919)
		keep := idem.Keep{}
		if i%1000 == 0 {
			keep.Uncertain = time.Hour
		}
		if _, _, err := s.AcquireKeep(ctx, key, "web-1:1:X.1", "fp", time.Hour, keep); err != nil {
			b.Fatal(err)
		}
		some = key
	}
	h := idemui.Handler(s)
	for _, page := range []struct{ name, path string }{
		{"in-progress", "/?state=in-progress"}, {"uncertain", "/?state=uncertain"}, {"lapsed", "/?state=lapsed"},
		{"prefix", "/?state=all&prefix=" + some[:16]}, {"record", "/record/" + some},
	} {
		path := page.path
		b.Run(page.name, func(b *testing.B) {
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
				if w.Code != http.StatusOK {
					b.Fatalf("GET %s = %d", path, w.Code)
				}
			}
		})
	}
}
