package benchmarks

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/benchmarks/internal/harness"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/pgstore"
)

// pgConn counts the writes of a PostgreSQL connection: pgx flushes each
// request in one write and then waits for its answer, so writes are round
// trips.
type pgConn struct {
	net.Conn
	n *atomic.Int64
}

func (c pgConn) Write(p []byte) (int, error) { c.n.Add(1); return c.Conn.Write(p) }

// newPgPool returns a pool on IDEM_POSTGRES_URL counting its round trips
// (pings of idle connections off, so only the store's statements count,
// and room for every b.RunParallel goroutine), and a fresh table name in
// the schema idem_bench, dropped at cleanup with its _floor sibling.
func newPgPool(tb testing.TB, conns int) (*pgxpool.Pool, string, *atomic.Int64) {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(requireEnv(tb, "IDEM_POSTGRES_URL"))
	if err != nil {
		tb.Fatal(err)
	}
	trips := new(atomic.Int64)
	d := &net.Dialer{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return pgConn{c, trips}, nil
	}
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.MaxConns = int32(conns)
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS idem_bench`); err != nil {
		tb.Fatalf("postgres at IDEM_POSTGRES_URL: %v", err)
	}
	name := fmt.Sprintf("b_%s_%d", harness.RunID, harness.Seq())
	tb.Cleanup(func() {
		for _, t := range []string{name, name + "_floor"} {
			_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{"idem_bench", t}.Sanitize())
		}
		pool.Close()
	})
	return pool, "idem_bench." + name, trips
}

func newPgStore(tb testing.TB, conns int) (*pgstore.Store, *pgxpool.Pool, string, *atomic.Int64) {
	tb.Helper()
	pool, table, trips := newPgPool(tb, conns)
	s := pgstore.New(pool, pgstore.WithTable(table))
	if err := s.EnsureSchema(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return s, pool, table, trips
}

func openPostgres(tb testing.TB) (idem.Store, *atomic.Int64) {
	s, _, _, trips := newPgStore(tb, 4*runtime.GOMAXPROCS(0))
	return s, trips
}

// BenchmarkPostgresFloor compares fresh idempotent requests through the
// engine on pgstore (acquire, complete: two statements) with a bare pgx
// pool issuing two plain statements of similar size on a table of the same
// shape (INSERT of a token with its lease, UPDATE storing the encoded
// response by primary key), at the same concurrency. Throughput ratio =
// bare ns/op ÷ idem ns/op; impl=paired alternates the two in chunks, so
// both see the same load on a shared machine.
func BenchmarkPostgresFloor(b *testing.B) {
	conns := floorParallelism * runtime.GOMAXPROCS(0)
	b.Run("impl=idem", func(b *testing.B) {
		s, _, _, trips := newPgStore(b, conns)
		e := newEngine(b, s)
		warmParallel(b, conns, func() error { return freshOp(e) })
		start := trips.Load()
		b.ReportAllocs()
		b.SetParallelism(floorParallelism)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := freshOp(e); err != nil {
					b.Error(err)
					return
				}
			}
		})
		reportTrips(b, trips, start)
	})
	b.Run("impl=paired", func(b *testing.B) {
		s, pool, table, _ := newPgStore(b, 2*conns)
		e := newEngine(b, s)
		floor := bareFloor(b, pool, table)
		idemOp := func() error { return freshOp(e) }
		warmParallel(b, conns, idemOp)
		warmParallel(b, conns, floor)
		paired(b, "idem", "bare", conns, idemOp, floor)
	})
	b.Run("impl=bare-pgx", func(b *testing.B) {
		_, pool, table, trips := newPgStore(b, conns)
		floor := bareFloor(b, pool, table)
		warmParallel(b, conns, floor)
		start := trips.Load()
		b.ReportAllocs()
		b.SetParallelism(floorParallelism)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := floor(); err != nil {
					b.Error(err)
					return
				}
			}
		})
		reportTrips(b, trips, start)
	})
}

func freshOp(e *idem.Engine) error {
	if code := runEngine(e, newKey()); code != http.StatusCreated {
		return fmt.Errorf("fresh: %s", statusText(code))
	}
	return nil
}

// bareFloor returns one bare request: two plain statements on a table
// shaped like pgstore's (primary key, expires_at index).
func bareFloor(b *testing.B, pool *pgxpool.Pool, table string) func() error {
	ctx := context.Background()
	floorTable := table + "_floor"
	if _, err := pool.Exec(ctx, `CREATE TABLE `+floorTable+` (key text PRIMARY KEY, state smallint NOT NULL,
  token text NOT NULL, fingerprint text NOT NULL, response bytea, expires_at timestamptz NOT NULL);
CREATE INDEX ON `+floorTable+` (expires_at)`); err != nil {
		b.Fatal(err)
	}
	encoded := benchResponse
	token := "AAAAAAAAAAAAAAAAAAAAAAAAAA" // rand.Text's length
	insert := `INSERT INTO ` + floorTable + ` VALUES ($1, 1, $2, 'fp', NULL, clock_timestamp() + interval '30 seconds')`
	update := `UPDATE ` + floorTable + ` SET state = 2, response = $2, expires_at = clock_timestamp() + interval '10 minutes' WHERE key = $1`
	return func() error {
		k := newKey()
		if _, err := pool.Exec(ctx, insert, k, token); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, update, k, encoded)
		return err
	}
}

// warmParallel runs op on n goroutines at once, so every pool connection
// is dialled and has its statements prepared before the measurement.
func warmParallel(b *testing.B, n int, op func() error) {
	errs := make(chan error, n)
	for range n {
		go func() { errs <- op() }()
	}
	for range n {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
}
