package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/pgstore"
)

// keepStore acquires every key under keep, as the engine does with
// WithTombstones or WithUncertainAfterCrash; the rest is the pgstore's
// (Unit, Extend, …: the engine finds them by type assertion).
type keepStore struct {
	*pgstore.Store
	keep idem.Keep
}

func (k keepStore) Acquire(ctx context.Context, key, token, fp string, lease time.Duration) (idem.Record, bool, error) {
	return k.AcquireKeep(ctx, key, token, fp, lease, k.keep)
}

// quoted returns table ("schema.name") as a quoted SQL name.
func quoted(table string) string { return pgx.Identifier(strings.Split(table, ".")).Sanitize() }

// rowOf reads the columns of key's row as stored, found = false when there is none.
type storedRow struct {
	state              int16
	token              string
	hasResponse, until bool
	keep               time.Duration // expires_at - coalesce(until_at, expires_at)
}

func rowOf(t *testing.T, pool *pgxpool.Pool, table, key string) (storedRow, bool) {
	t.Helper()
	var (
		r  storedRow
		us int64
	)
	err := pool.QueryRow(ctxT(t), `SELECT state, token, response IS NOT NULL, until_at IS NOT NULL,
  (EXTRACT(EPOCH FROM expires_at - coalesce(until_at, expires_at)) * 1000000)::bigint
FROM `+quoted(table)+` WHERE key = $1`, key).Scan(&r.state, &r.token, &r.hasResponse, &r.until, &us)
	if errors.Is(err, pgx.ErrNoRows) {
		return storedRow{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	r.keep = time.Duration(us) * time.Microsecond
	return r, true
}

// TestTxTombstone: a handler that wrote through pgstore.Tx, under a
// tombstone keep, commits its write with a completed record that carries
// the keep: after the retention the key answers as a tombstone, the purge
// frees its response but keeps it, and the write stays (once).
func TestTxTombstone(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s, table := newStore(t, pool)
	payments := createPayments(t, pool, table)
	const retention = 2 * time.Second
	e, err := idem.New(keepStore{s, idem.Keep{Tombstone: time.Hour}}, idem.WithRetention(retention))
	if err != nil {
		t.Fatal(err)
	}
	x, resp := e.Begin(ctxT(t), request("k1", `{"amount":100}`))
	if x == nil {
		t.Fatalf("Begin = %+v; want an execution", resp)
	}
	ctx := x.WithInfo(ctxT(t))
	tx, err := pgstore.Tx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+payments+` (idem_key, amount) VALUES ('k1', 100)`); err != nil {
		t.Fatal(err)
	}
	_, _ = x.Write([]byte(`{"id":"pay_1"}`))
	start := time.Now() // before the completion sets the retention: the check within it holds however slow Finish is
	x.Finish(http.StatusCreated, http.Header{"Content-Type": {"application/json"}})

	var key string
	if err := pool.QueryRow(ctxT(t), `SELECT key FROM `+quoted(table)).Scan(&key); err != nil {
		t.Fatal(err)
	}
	row, _ := rowOf(t, pool, table, key)
	if row.state != 2 || !row.hasResponse || !row.until || row.keep != time.Hour {
		t.Fatalf("row completed through the unit's transaction = %+v; want completed, with its response and a 1h tombstone keep", row)
	}
	if rows := countRows(t, pool, payments, "k1"); rows != 1 {
		t.Fatalf("%d payment rows; want 1", rows)
	}
	if rec, found, err := s.Get(ctxT(t), key); time.Since(start) < retention && (err != nil || !found || rec.State != idem.StateCompleted || rec.Response == nil) {
		t.Fatalf("Get within the retention = %+v, %v, %v; want completed", rec, found, err)
	}

	time.Sleep(retention + 200*time.Millisecond) // after the completion: past its retention
	rec, ok, err := s.Acquire(ctxT(t), key, storetest.Token(), "other", time.Minute)
	if err != nil || ok || rec.State != idem.StateExpired || rec.Response != nil || rec.Token != "" {
		t.Fatalf("Acquire after the retention = %+v, %v, %v; want the tombstone", rec, ok, err)
	}
	if row, _ := rowOf(t, pool, table, key); !row.hasResponse {
		t.Fatalf("response freed before any purge: %+v", row)
	}
	if n, err := s.Purge(ctxT(t)); err != nil || n != 0 {
		t.Fatalf("Purge = %d, %v; want nothing deleted", n, err)
	}
	if row, found := rowOf(t, pool, table, key); !found || row.hasResponse || row.token != "" || row.state != 2 {
		t.Fatalf("tombstone after the purge = %+v, %v; want kept, without response or token", row, found)
	}
	if rec, found, err := s.Get(ctxT(t), key); err != nil || !found || rec.State != idem.StateExpired {
		t.Fatalf("Get of the purged tombstone = %+v, %v, %v", rec, found, err)
	}
	if rows := countRows(t, pool, payments, "k1"); rows != 1 {
		t.Fatalf("%d payment rows; want 1", rows)
	}
}

// TestPurgeTombstones: the purge frees the responses of tombstones at the
// end of their retention and deletes them at the end of their keep, and
// touches nothing else; its free statement can scan the until_at index.
func TestPurgeTombstones(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s, table := newStore(t, pool)
	const short = 300 * time.Millisecond
	complete := func(keep idem.Keep, retention time.Duration) string {
		t.Helper()
		key, tok := storetest.Key(), storetest.Token()
		if _, ok, err := s.AcquireKeep(ctxT(t), key, tok, "fp", time.Minute, keep); err != nil || !ok {
			t.Fatalf("AcquireKeep = %v, %v", ok, err)
		}
		if err := s.Complete(ctxT(t), key, tok, []byte("response"), retention); err != nil {
			t.Fatal(err)
		}
		return key
	}
	freed := complete(idem.Keep{Tombstone: time.Hour}, short)
	gone := complete(idem.Keep{Tombstone: short}, short)
	plain := complete(idem.Keep{}, time.Hour)
	live := complete(idem.Keep{Tombstone: time.Hour}, time.Hour)
	uncertainKey, owner := storetest.Key(), storetest.Token()
	if _, ok, err := s.AcquireKeep(ctxT(t), uncertainKey, owner, "fp", time.Millisecond, idem.Keep{Uncertain: time.Hour}); err != nil || !ok {
		t.Fatalf("AcquireKeep = %v, %v", ok, err)
	}
	time.Sleep(2*short + 200*time.Millisecond)

	if n, err := s.Purge(ctxT(t)); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want the one tombstone whose keep ended deleted", n, err)
	}
	if _, found := rowOf(t, pool, table, gone); found {
		t.Fatal("a tombstone whose keep ended was not deleted")
	}
	if row, found := rowOf(t, pool, table, freed); !found || row.hasResponse || row.token != "" {
		t.Fatalf("tombstone = %+v, %v; want kept without response or token", row, found)
	}
	for _, key := range []string{plain, live} {
		if row, found := rowOf(t, pool, table, key); !found || !row.hasResponse || row.token == "" {
			t.Fatalf("completed record within its retention = %+v, %v; want untouched", row, found)
		}
	}
	if row, found := rowOf(t, pool, table, uncertainKey); !found || row.state != 1 || row.token != owner {
		t.Fatalf("uncertain record = %+v, %v; want untouched", row, found)
	}

	conn, err := pool.Acquire(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctxT(t), `SET enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctxT(t), `RESET enable_seqscan`) }()
	var plan strings.Builder
	r, err := conn.Query(ctxT(t), `EXPLAIN `+pgstore.FreeSQL(s), pgstore.PurgeBatch)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var line string
		_ = r.Scan(&line)
		plan.WriteString(line + "\n")
	}
	r.Close()
	if !strings.Contains(plan.String(), "_until_at") {
		t.Fatalf("the purge's free plan does not use the until_at index:\n%s", plan.String())
	}
}

// oldSchema is the table of pgstore before Keep (v0 of the schema).
const oldSchema = `CREATE TABLE %[1]s (
  key         text PRIMARY KEY,
  state       smallint NOT NULL,
  token       text NOT NULL,
  fingerprint text NOT NULL,
  response    bytea,
  expires_at  timestamptz NOT NULL
);
CREATE INDEX %[2]s ON %[1]s (expires_at);`

// TestEnsureSchemaUpgrade: EnsureSchema adds the keep columns to a table
// of the previous version, whose rows keep working as records without a
// keep; a second EnsureSchema does not take the ALTER TABLE's lock.
func TestEnsureSchemaUpgrade(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	table := newTable(t, pool)
	name := strings.SplitN(table, ".", 2)[1]
	if _, err := pool.Exec(ctxT(t), strings.NewReplacer("%[1]s", quoted(table), "%[2]s", pgx.Identifier{name + "_expires_at"}.Sanitize()).Replace(oldSchema)); err != nil {
		t.Fatal(err)
	}
	// Rows as the previous version wrote them.
	held, lapsed, done, expired := storetest.Key(), storetest.Key(), storetest.Key(), storetest.Key()
	if _, err := pool.Exec(ctxT(t), `INSERT INTO `+quoted(table)+` VALUES
  ($1, 1, 'tok-held', 'fp', NULL, clock_timestamp() + interval '1 minute'),
  ($2, 1, 'tok-lapsed', 'fp', NULL, clock_timestamp() - interval '1 second'),
  ($3, 2, 'tok-done', 'fp', 'response', clock_timestamp() + interval '1 hour'),
  ($4, 2, 'tok-expired', 'fp', 'response', clock_timestamp() - interval '1 second')`, held, lapsed, done, expired); err != nil {
		t.Fatal(err)
	}

	s := pgstore.New(pool, pgstore.WithTable(table))
	for range 2 {
		if err := s.EnsureSchema(ctxT(t)); err != nil {
			t.Fatalf("EnsureSchema on the previous version's table: %v", err)
		}
	}
	if rec, found, err := s.Get(ctxT(t), held); err != nil || !found || rec.State != idem.StateInProgress || rec.Token != "tok-held" {
		t.Fatalf("Get of an old in-progress row = %+v, %v, %v", rec, found, err)
	}
	if err := s.Extend(ctxT(t), held, "tok-held", time.Minute); err != nil {
		t.Fatalf("Extend of an old in-progress row: %v", err)
	}
	if err := s.Complete(ctxT(t), held, "tok-held", []byte("r"), time.Hour); err != nil {
		t.Fatalf("Complete of an old in-progress row: %v", err)
	}
	rec, ok, err := s.Acquire(ctxT(t), done, "t2", "fp", time.Minute)
	if err != nil || ok || rec.State != idem.StateCompleted || string(rec.Response) != "response" {
		t.Fatalf("Acquire of an old completed row = %+v, %v, %v; want its replay", rec, ok, err)
	}
	for _, key := range []string{lapsed, expired} {
		if _, ok, err := s.Acquire(ctxT(t), key, "t2", "fp", time.Minute); err != nil || !ok {
			t.Fatalf("Acquire of an old expired row = %v, %v; want it taken over", ok, err)
		}
	}
	// The upgraded table keeps records with a keep.
	key := storetest.Key()
	if _, ok, err := s.AcquireKeep(ctxT(t), key, "t3", "fp", time.Millisecond, idem.Keep{Uncertain: time.Hour}); err != nil || !ok {
		t.Fatalf("AcquireKeep on the upgraded table = %v, %v", ok, err)
	}
	time.Sleep(50 * time.Millisecond)
	if rec, found, err := s.Get(ctxT(t), key); err != nil || !found || rec.State != idem.StateUncertain {
		t.Fatalf("Get of an uncertain record on the upgraded table = %+v, %v, %v", rec, found, err)
	}

	// A reader holds ACCESS SHARE: an ALTER TABLE would wait for it, so
	// EnsureSchema returning shows it skipped the ALTER.
	reader, err := pool.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reader.Rollback(context.Background()) }()
	if _, err := reader.Exec(ctxT(t), `SELECT count(*) FROM `+quoted(table)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // an ALTER would wait for the reader forever
	defer cancel()
	if err := s.EnsureSchema(ctx); err != nil {
		t.Fatalf("EnsureSchema on an up-to-date table while a reader holds it: %v", err)
	}
}

// engineResponse is the engine's encoding of a 201 with a JSON body of
// size bytes: what Complete stores.
func engineResponse(size int) []byte {
	return idem.EncodeResponse(&idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: bytes.Repeat([]byte("x"), size)})
}

// TestTombstoneCost measures what a tombstone costs next to a completed
// record with a 200-byte body: the average pg_column_size of a row, and
// the table's size (heap; heap, TOAST and indexes) per 10,000 rows after
// VACUUM FULL. Rows have the shape the engine gives them (64-hex key and
// fingerprint, a 30-character token); the tombstones are made by Purge.
// Run with -v to read the figures (README, "Uncertain records and tombstones").
// It asserts on the row size only: VACUUM FULL keeps the row versions the
// purge replaced while any other session in the database holds an older
// snapshot (the suite's parallel transactions do), so the table sizes are
// figures to read on a quiet database, not a property of the layout.
func TestTombstoneCost(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	resp := engineResponse(200)
	const rows = 10000
	measure := func(what, keepSQL, untilSQL, retention string, purge bool) (rowBytes float64) {
		t.Helper()
		s, table := newStore(t, pool)
		if _, err := pool.Exec(ctxT(t), `INSERT INTO `+quoted(table)+` (key, state, token, fingerprint, response, expires_at, until_at)
SELECT md5(i::text) || md5('k' || i), 2, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ.' || lpad(to_hex(i), 3, '0'),
  md5('f' || i) || md5('g' || i), $1, clock_timestamp() + `+retention+` + `+keepSQL+`, `+untilSQL+`
FROM generate_series(1, `+"10000"+`) i`, resp); err != nil {
			t.Fatal(err)
		}
		if purge {
			if _, err := s.Purge(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		}
		q := quoted(table)
		if _, err := pool.Exec(ctxT(t), `VACUUM FULL `+q); err != nil {
			t.Fatal(err)
		}
		var (
			n           int
			heap, total int64
		)
		if err := pool.QueryRow(ctxT(t), `SELECT count(*), avg(pg_column_size(r.*)), pg_relation_size($1::regclass), pg_total_relation_size($1::regclass)
FROM `+q+` r`, q).Scan(&n, &rowBytes, &heap, &total); err != nil {
			t.Fatal(err)
		}
		if n != rows {
			t.Fatalf("%s: %d rows; want %d", what, n, rows)
		}
		t.Logf("%-46s row %5.0f B   heap %8d B (%3.0f B/row)   total %8d B (%3.0f B/row)",
			what, rowBytes, heap, float64(heap)/rows, total, float64(total)/rows)
		return rowBytes
	}
	t.Logf("engine encoding of a 201 with a 200-byte body: %d bytes", len(resp))
	cRow := measure("completed, 200-byte body, no keep", "interval '0'", "NULL", "interval '1 hour'", false)
	measure("completed, 200-byte body, under a tombstone keep", "interval '1 day'", "clock_timestamp() + interval '1 hour'", "interval '1 hour'", false)
	tRow := measure("tombstone (after the purge)", "interval '1 day'", "clock_timestamp() - interval '1 second'", "- interval '1 second'", true)
	if tRow >= cRow/2 {
		t.Fatalf("a tombstone (%.0f B/row) is not under half a completed record (%.0f B/row)", tRow, cRow)
	}
}
