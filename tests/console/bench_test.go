package console

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/observability/idemui"
	"github.com/idemkit/idem/stores/pgstore"
)

// BenchmarkPostgresMillion measures the console's pages on a pgstore
// table of a million records (in progress, expiring a millisecond apart;
// 1 in 1,000 uncertain, its lease lapsed under a keep): each listing is one
// bounded page of the store's List, in the order of its expiry index.
//
//	cd tests/console && go test -run X -bench PostgresMillion -benchtime 10x .
func BenchmarkPostgresMillion(b *testing.B) {
	ctx := context.Background()
	u := cmpOr(os.Getenv("IDEM_POSTGRES_URL"), "postgres://postgres@127.0.0.1:5432/test")
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	table := "idemui_bench_" + randomHex(12)
	s := pgstore.New(pool, pgstore.WithTable(table))
	defer func() {
		_ = s.Close()
		_, _ = pool.Exec(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+table)
	}()
	if err := s.EnsureSchema(ctx); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (key, state, token, fingerprint, expires_at, until_at, keep_uncertain)
SELECT md5(i::text) || md5((i + 1)::text), 1, 'web-1:1:X.1', 'fp', now() + interval '1 hour' + i * interval '1 millisecond',
  CASE WHEN i % 1000 = 0 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' + i * interval '1 millisecond' END,
  CASE WHEN i % 1000 = 0 THEN 3600000000000 END
FROM generate_series(1, 1000000) i`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+table); err != nil {
		b.Fatal(err)
	}
	b.Logf("1,000,000 rows inserted in %v", time.Since(start).Round(time.Millisecond))
	var some string
	if err := pool.QueryRow(ctx, `SELECT key FROM `+table+` LIMIT 1`).Scan(&some); err != nil {
		b.Fatal(err)
	}
	h := idemui.Handler(s)
	for _, page := range []struct{ name, path string }{
		{"in-progress", "/?state=in-progress"}, {"uncertain", "/?state=uncertain"}, {"all", "/?state=all"},
		{"prefix", "/?state=all&prefix=" + some[:16]}, {"record", "/record/" + some},
	} {
		b.Run(page.name, func(b *testing.B) {
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, page.path, nil))
				if w.Code != http.StatusOK {
					b.Fatalf("GET %s = %d", page.path, w.Code)
				}
			}
		})
	}
}
