package benchmarks

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/benchmarks/internal/harness"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mysqlstore"
)

// myConn counts the writes of a MySQL connection: the driver writes each
// command once and then waits for its answer, so writes are round trips
// (the store's statements are prepared once per connection; the warm-up
// prepares them).
type myConn struct {
	net.Conn
	n *atomic.Int64
}

func (c myConn) Write(p []byte) (int, error) { c.n.Add(1); return c.Conn.Write(p) }

// newMyDB returns a *sql.DB on IDEM_MYSQL_DSN counting its round trips,
// with room for every b.RunParallel goroutine, and a fresh table name,
// dropped at cleanup with its procedure and its _floor sibling.
func newMyDB(tb testing.TB, conns int) (*sql.DB, string, *atomic.Int64) {
	tb.Helper()
	cfg, err := mysql.ParseDSN(requireEnv(tb, "IDEM_MYSQL_DSN"))
	if err != nil {
		tb.Fatal(err)
	}
	trips := new(atomic.Int64)
	d := &net.Dialer{}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return myConn{c, trips}, nil
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	if err := db.Ping(); err != nil {
		tb.Fatalf("mysql at IDEM_MYSQL_DSN: %v", err)
	}
	name := fmt.Sprintf("idem_bench_%s_%d", harness.RunID, harness.Seq())
	tb.Cleanup(func() {
		for _, q := range []string{"DROP TABLE IF EXISTS `" + name + "`", "DROP TABLE IF EXISTS `" + name + "_floor`",
			"DROP PROCEDURE IF EXISTS `" + name + mysqlstore.ProcSuffix + "`"} {
			_, _ = db.Exec(q)
		}
		_ = db.Close()
	})
	return db, name, trips
}

func newMyStore(tb testing.TB, conns int) (*mysqlstore.Store, *sql.DB, string, *atomic.Int64) {
	tb.Helper()
	db, table, trips := newMyDB(tb, conns)
	s := mysqlstore.New(db, mysqlstore.WithTable(table))
	if err := s.EnsureSchema(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s, db, table, trips
}

func openMySQL(tb testing.TB) (idem.Store, *atomic.Int64) {
	s, _, _, trips := newMyStore(tb, 4*runtime.GOMAXPROCS(0))
	return s, trips
}

// BenchmarkMySQLFloor compares fresh idempotent requests through the
// engine on mysqlstore (the acquire procedure's CALL, the conditional
// completion UPDATE) with a bare *sql.DB sending two plain prepared
// statements of similar size on a table of the same shape (INSERT of a
// token with its lease, UPDATE storing the encoded response by primary
// key), at the same concurrency. Throughput ratio = bare ns/op ÷ idem
// ns/op; impl=paired alternates the two in chunks, so both see the same
// load on a shared machine.
func BenchmarkMySQLFloor(b *testing.B) {
	conns := floorParallelism * runtime.GOMAXPROCS(0)
	b.Run("impl=idem", func(b *testing.B) {
		s, _, _, trips := newMyStore(b, conns)
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
		s, db, table, _ := newMyStore(b, 2*conns)
		e := newEngine(b, s)
		floor := bareMyFloor(b, db, table)
		idemOp := func() error { return freshOp(e) }
		warmParallel(b, conns, idemOp)
		warmParallel(b, conns, floor)
		paired(b, "idem", "bare", conns, idemOp, floor)
	})
	b.Run("impl=bare-sql", func(b *testing.B) {
		_, db, table, trips := newMyStore(b, conns)
		floor := bareMyFloor(b, db, table)
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

// bareMyFloor returns one bare request: two plain prepared statements on a
// table shaped like mysqlstore's (primary key, expires_at index).
func bareMyFloor(b *testing.B, db *sql.DB, table string) func() error {
	ctx := context.Background()
	floorTable := "`" + table + "_floor`"
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+floorTable+" (`key` VARBINARY(255) NOT NULL PRIMARY KEY, state TINYINT NOT NULL, "+
		`token VARBINARY(255) NOT NULL, fingerprint VARBINARY(255) NOT NULL, response LONGBLOB NULL, expires_at DATETIME(6) NOT NULL,
  KEY (expires_at)) ENGINE=InnoDB`); err != nil {
		b.Fatal(err)
	}
	encoded := benchResponse
	token := "AAAAAAAAAAAAAAAAAAAAAAAAAA" // rand.Text's length
	insert, err := db.PrepareContext(ctx, `INSERT INTO `+floorTable+` VALUES (?, 1, ?, 'fp', NULL, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND)`)
	if err != nil {
		b.Fatal(err)
	}
	update, err := db.PrepareContext(ctx, `UPDATE `+floorTable+" SET state = 2, response = ?, expires_at = UTC_TIMESTAMP(6) + INTERVAL 10 MINUTE WHERE `key` = ?")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = insert.Close(); _ = update.Close() })
	return func() error {
		k := newKey()
		if _, err := insert.ExecContext(ctx, k, token); err != nil {
			return err
		}
		_, err := update.ExecContext(ctx, encoded, k)
		return err
	}
}
