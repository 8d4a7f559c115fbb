package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mysqlstore"
)

// keepStore is a mysqlstore as an engine under a Keep would use it: every
// acquire carries keep. It is no Extender, so the engine never renews a
// lease and a slow handler's lease lapses.
type keepStore struct {
	s    *mysqlstore.Store
	keep idem.Keep
}

func (k keepStore) Acquire(ctx context.Context, key, token, fp string, lease time.Duration) (idem.Record, bool, error) {
	return k.s.AcquireKeep(ctx, key, token, fp, lease, k.keep)
}
func (k keepStore) Complete(ctx context.Context, key, token string, resp []byte, ret time.Duration) error {
	return k.s.Complete(ctx, key, token, resp, ret)
}
func (k keepStore) Release(ctx context.Context, key, token string) error {
	return k.s.Release(ctx, key, token)
}
func (k keepStore) Get(ctx context.Context, key string) (idem.Record, bool, error) {
	return k.s.Get(ctx, key)
}
func (k keepStore) Unit(key, token string) idem.Unit { return k.s.Unit(key, token) }

// rawRow is what the table holds for key.
type rawRow struct {
	state              int
	token              string
	responseNull, gone bool
	keepTombstone      sql.NullInt64
}

func readRow(t *testing.T, db *sql.DB, table, key string) rawRow {
	t.Helper()
	var r rawRow
	err := db.QueryRowContext(ctxT(t), "SELECT state, token, response IS NULL, keep_tombstone FROM `"+table+"` WHERE `key` = ?", key).
		Scan(&r.state, &r.token, &r.responseNull, &r.keepTombstone)
	if errors.Is(err, sql.ErrNoRows) {
		return rawRow{gone: true}
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestTxUnderKeep: a handler writes through Tx on a record acquired under
// both keeps; its lease lapses mid-handler (uncertain: no other request
// takes it over), yet its own completion commits the write with the
// record, which carries its tombstone keep: after the retention the key
// answers expired, the purger frees the response and keeps the
// fingerprint, and the payment row stays the only one.
func TestTxUnderKeep(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	s, table := newStore(t, db)
	payments := createPayments(t, db, table)
	const lease, retention = 2 * time.Second, 2 * time.Second
	e, err := idem.New(keepStore{s, idem.Keep{Uncertain: time.Hour, Tombstone: time.Hour}},
		idem.WithGlobalScope(), idem.WithLease(lease), idem.WithStoreTimeout(lease/4), idem.WithRetention(retention))
	if err != nil {
		t.Fatal(err)
	}
	req := request("under-keep", `{"amount":1}`)
	key := idem.ScopedKey(req.Principal, req.Method, req.Path, "under-keep")
	x, resp := e.Begin(ctxT(t), req)
	if x == nil {
		t.Fatalf("Begin = %+v; want an execution", resp)
	}
	ctx := x.WithInfo(ctxT(t))
	tx, err := mysqlstore.Tx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := insertPayment(ctx, tx, payments, "under-keep"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease + 300*time.Millisecond) // the lease lapses: the record is uncertain
	rec, ok, err := s.Acquire(ctxT(t), key, storetest.Token(), "fp", time.Minute)
	if err != nil || ok || rec.State != idem.StateUncertain {
		t.Fatalf("Acquire during the handler, its lease lapsed = %+v, %v, %v; want uncertain, not taken over", rec, ok, err)
	}
	if _, err := x.Write([]byte(`{"id":"pay_1"}`)); err != nil {
		t.Fatal(err)
	}
	completing := time.Now() // before the completion sets the retention: the check within it holds however slow Finish is
	x.Finish(http.StatusCreated, http.Header{"Content-Type": {"application/json"}})
	finished := time.Now()
	if n := countRows(t, db, payments, "under-keep"); n != 1 {
		t.Fatalf("%d payment rows after the uncertain owner's completion; want its 1", n)
	}
	if r := readRow(t, db, table, key); r.state != 2 || r.responseNull || r.keepTombstone.Int64 != time.Hour.Microseconds() {
		t.Fatalf("row after the completion = %+v; want completed with its response and the tombstone keep", r)
	}
	if _, resp := e.Begin(ctxT(t), req); time.Since(completing) < retention && (resp == nil || !resp.IsReplay()) {
		t.Fatalf("retry within the retention = %+v; want a replay", resp)
	}

	time.Sleep(time.Until(finished.Add(retention + 300*time.Millisecond)))
	rec, ok, err = s.AcquireKeep(ctxT(t), key, storetest.Token(), "fp", time.Minute, idem.Keep{})
	if err != nil || ok || rec.State != idem.StateExpired || rec.Response != nil || rec.Token != "" {
		t.Fatalf("Acquire after the retention = %+v, %v, %v; want its tombstone", rec, ok, err)
	}
	// The acquire freed the response already; the purger has nothing left
	// to do and deletes nothing.
	if r := readRow(t, db, table, key); r.state != 4 || !r.responseNull || r.token != "" {
		t.Fatalf("row after an acquire of the tombstone = %+v; want state 4, no response, no token", r)
	}
	if n, err := s.Purge(ctxT(t)); err != nil || n != 0 {
		t.Fatalf("Purge = %d, %v; want nothing deleted", n, err)
	}
	if n := countRows(t, db, payments, "under-keep"); n != 1 {
		t.Fatalf("%d payment rows; want 1", n)
	}
	// An operator sees the tombstone, until its keep ends, and evicts it.
	info, found, err := s.Inspect(ctxT(t), key)
	if err != nil || !found || info.State != idem.StateExpired || info.Token != "" || info.Response != nil ||
		info.TTL <= time.Hour-time.Minute || info.TTL > time.Hour {
		t.Fatalf("Inspect of the tombstone = %+v, %v, %v; want expired, TTL about 1h", info, found, err)
	}
	if err := s.Evict(ctxT(t), key, info.Record); err != nil {
		t.Fatalf("Evict of the tombstone: %v", err)
	}
	if r := readRow(t, db, table, key); !r.gone {
		t.Fatalf("row after Evict = %+v; want none", r)
	}
}

// TestPurgeKeep: the purger frees a tombstone's response when its
// retention ends and deletes it when its keep ends, and deletes an
// uncertain record when its keep ends, not before.
func TestPurgeKeep(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	s, table := newStore(t, db)
	acquire := func(lease time.Duration, keep idem.Keep) (string, string) {
		key, tok := storetest.Key(), storetest.Token()
		if _, ok, err := s.AcquireKeep(ctxT(t), key, tok, "fp", lease, keep); err != nil || !ok {
			t.Fatalf("AcquireKeep = %v, %v", ok, err)
		}
		return key, tok
	}
	long, short := time.Hour, 3*time.Second // short: longer than the checks below take on a loaded machine
	tomb, tok := acquire(time.Minute, idem.Keep{Tombstone: long})
	if err := s.Complete(ctxT(t), tomb, tok, []byte("response"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	shortTomb, tok := acquire(time.Minute, idem.Keep{Tombstone: short})
	if err := s.Complete(ctxT(t), shortTomb, tok, []byte("response"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	uncertain, _ := acquire(time.Millisecond, idem.Keep{Uncertain: long})
	shortUncertain, _ := acquire(time.Millisecond, idem.Keep{Uncertain: short})
	last := time.Now() // the short keeps end before last + short
	completed, tok := acquire(time.Minute, idem.Keep{})
	if err := s.Complete(ctxT(t), completed, tok, []byte("response"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)

	// Lazily on read: the tombstone's response is never handed out, even
	// before it is freed.
	if rec, found, err := s.Get(ctxT(t), tomb); err != nil || !found || rec.State != idem.StateExpired || rec.Response != nil || rec.Token != "" {
		t.Fatalf("Get of a tombstone not purged yet = %+v, %v, %v", rec, found, err)
	}
	if r := readRow(t, db, table, tomb); r.state != 2 || r.responseNull {
		t.Fatalf("tombstone row before the purge = %+v; want the completed row, response still stored", r)
	}
	n, freed, err := mysqlstore.PurgeCounts(s, ctxT(t))
	if err != nil || n != 1 || freed != 2 {
		t.Fatalf("Purge = %d deleted, %d freed, %v; want the completed record deleted, 2 tombstones freed", n, freed, err)
	}
	for _, k := range []string{tomb, shortTomb} {
		if r := readRow(t, db, table, k); r.state != 4 || !r.responseNull || r.token != "" || r.keepTombstone.Valid {
			t.Fatalf("tombstone row after the purge = %+v; want state 4, no response, token or keep", r)
		}
		if rec, found, err := s.Get(ctxT(t), k); err != nil || !found || rec.State != idem.StateExpired || rec.Fingerprint != "fp" {
			t.Fatalf("Get of a purged tombstone = %+v, %v, %v", rec, found, err)
		}
	}
	for _, k := range []string{uncertain, shortUncertain} {
		if rec, found, err := s.Get(ctxT(t), k); err != nil || !found || rec.State != idem.StateUncertain {
			t.Fatalf("Get of an uncertain record after a purge = %+v, %v, %v", rec, found, err)
		}
	}

	time.Sleep(time.Until(last.Add(short + 300*time.Millisecond)))
	if n, err := s.Purge(ctxT(t)); err != nil || n != 2 {
		t.Fatalf("Purge after the short keeps ended = %d, %v; want 2 deleted", n, err)
	}
	for k, want := range map[string]bool{tomb: false, shortTomb: true, uncertain: false, shortUncertain: true, completed: true} {
		if gone := readRow(t, db, table, k).gone; gone != want {
			t.Fatalf("%s…: deleted = %v; want %v", k[:8], gone, want)
		}
	}
	if rows := rowsIn(t, db, table); rows != 2 {
		t.Fatalf("%d rows left; want the 2 under long keeps", rows)
	}
}

// v2Schema is the table and acquire procedure of the previous version
// (procedure "idem mysqlstore acquire v2"), as its SchemaSQL wrote them.
func v2Schema(table string) []string {
	t := "`" + table + "`"
	live := `expires_at > UTC_TIMESTAMP(6)`
	cond := `(expires_at <= UTC_TIMESTAMP(6) OR (state = 1 AND token = p_token))`
	return []string{
		`CREATE TABLE ` + t + " (`key` VARBINARY(255) NOT NULL, state TINYINT NOT NULL, token VARBINARY(255) NOT NULL, " +
			"fingerprint VARBINARY(255) NOT NULL, response LONGBLOB NULL, expires_at DATETIME(6) NOT NULL, " +
			"PRIMARY KEY (`key`), KEY `" + table + "_expires_at` (expires_at)) ENGINE=InnoDB",
		"CREATE PROCEDURE `" + table + `_acquire` + "`" + `(IN p_key VARBINARY(255), IN p_token VARBINARY(255), IN p_fp VARBINARY(255), IN p_lease BIGINT)
  MODIFIES SQL DATA
  COMMENT 'idem mysqlstore acquire v2'
BEGIN
  IF NOT EXISTS (SELECT 1 FROM ` + t + " WHERE `key` = p_key AND " + live + ` AND NOT (state = 1 AND token = p_token)) THEN
    INSERT INTO ` + t + " (`key`, state, token, fingerprint, response, expires_at)" + `
    VALUES (p_key, 1, p_token, p_fp, NULL, UTC_TIMESTAMP(6) + INTERVAL p_lease MICROSECOND)
    ON DUPLICATE KEY UPDATE
      fingerprint = IF(` + cond + `, p_fp, fingerprint),
      response = IF(` + cond + `, NULL, response),
      state = IF(` + cond + `, 1, state),
      token = IF(` + cond + `, p_token, token),
      expires_at = IF(` + cond + `, UTC_TIMESTAMP(6) + INTERVAL p_lease MICROSECOND, expires_at);
  END IF;
  SELECT state, token, fingerprint, response, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) AS left_us
    FROM ` + t + " WHERE `key` = p_key AND (" + live + ` OR (state = 1 AND token = p_token));
END`,
	}
}

// TestUpgradeFromV2: EnsureSchema on a table and procedure of the previous
// version adds the keep columns and this version's procedure, once (a
// second run changes nothing), and leaves the v2 procedure working for v2
// instances; the records that version wrote read as before, as records
// without a keep, and every transition works on them.
func TestUpgradeFromV2(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	table := newTable(t, db)
	for _, q := range v2Schema(table) {
		if _, err := db.ExecContext(ctxT(t), q); err != nil {
			t.Fatal(err)
		}
	}
	// Rows written through the v2 procedure and statements: in progress,
	// completed, and a lapsed lease.
	call := func(key, tok string, leaseUS int64) {
		t.Helper()
		rows, err := db.QueryContext(ctxT(t), "CALL `"+table+"_acquire`(?, ?, ?, ?)", key, tok, "fp", leaseUS)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
	}
	inProgress, completed, lapsed := storetest.Key(), storetest.Key(), storetest.Key()
	call(inProgress, "tok-p", time.Hour.Microseconds())
	call(completed, "tok-c", time.Hour.Microseconds())
	call(lapsed, "tok-l", 1)
	if _, err := db.ExecContext(ctxT(t), "UPDATE `"+table+"` SET state = 2, response = 'old response', expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE `key` = ?", completed); err != nil {
		t.Fatal(err)
	}

	s := mysqlstore.New(db, mysqlstore.WithTable(table))
	defer s.Close()
	for range 2 {
		if err := s.EnsureSchema(ctxT(t)); err != nil {
			t.Fatalf("EnsureSchema on the v2 schema: %v", err)
		}
	}
	var cols int
	if err := db.QueryRowContext(ctxT(t), `SELECT count(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?
AND COLUMN_NAME IN ('ends_at', 'keep_uncertain', 'keep_tombstone')`, table).Scan(&cols); err != nil || cols != 3 {
		t.Fatalf("%d keep columns after the upgrade, %v; want 3", cols, err)
	}
	var comment string
	if err := db.QueryRowContext(ctxT(t), `SELECT ROUTINE_COMMENT FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = ?`,
		table+mysqlstore.ProcSuffix).Scan(&comment); err != nil || comment != mysqlstore.ProcVersion {
		t.Fatalf("procedure comment %q, %v; want %q", comment, err, mysqlstore.ProcVersion)
	}
	// The v2 procedure is left to the instances still running v2 (a
	// rolling deploy): their acquires keep working on the upgraded table.
	v2Key := storetest.Key()
	call(v2Key, "tok-v2", time.Hour.Microseconds())
	if rec, ok, err := s.Acquire(ctxT(t), v2Key, "other", "fp", time.Minute); err != nil || ok || rec.State != idem.StateInProgress || rec.Token != "tok-v2" {
		t.Fatalf("Acquire of a row a v2 instance acquired after the upgrade = %+v, %v, %v; want it held by tok-v2", rec, ok, err)
	}

	if rec, ok, err := s.Acquire(ctxT(t), inProgress, "other", "fp", time.Minute); err != nil || ok || rec.State != idem.StateInProgress || rec.Token != "tok-p" || rec.LeaseLeft <= 0 {
		t.Fatalf("Acquire of a v2 in-progress row = %+v, %v, %v; want it held", rec, ok, err)
	}
	if err := s.Extend(ctxT(t), inProgress, "tok-p", time.Hour); err != nil {
		t.Fatalf("Extend of a v2 row: %v", err)
	}
	if err := s.Complete(ctxT(t), inProgress, "tok-p", []byte("new response"), time.Hour); err != nil {
		t.Fatalf("Complete of a v2 row: %v", err)
	}
	if rec, ok, err := s.Acquire(ctxT(t), completed, "other", "fp", time.Minute); err != nil || ok || rec.State != idem.StateCompleted || string(rec.Response) != "old response" {
		t.Fatalf("Acquire of a v2 completed row = %+v, %v, %v; want its replay", rec, ok, err)
	}
	info, found, err := s.Inspect(ctxT(t), completed)
	if err != nil || !found || info.State != idem.StateCompleted || info.TTL <= 0 || info.TTL > time.Hour {
		t.Fatalf("Inspect of a v2 completed row = %+v, %v, %v", info, found, err)
	}
	if err := s.Evict(ctxT(t), completed, info.Record); err != nil {
		t.Fatalf("Evict of a v2 completed row: %v", err)
	}
	// A lapsed v2 lease is taken over, even under a keep: the stored
	// record, not the caller's keep, decides.
	if _, ok, err := s.AcquireKeep(ctxT(t), lapsed, "new", "fp", time.Minute, idem.Keep{Uncertain: time.Hour}); err != nil || !ok {
		t.Fatalf("AcquireKeep of a lapsed v2 lease = %v, %v; want it taken over", ok, err)
	}
	if err := s.Resolve(ctxT(t), completed, nil, 0); !errors.Is(err, idem.ErrRecordChanged) {
		t.Fatalf("Resolve of an evicted key = %v", err)
	}
}

// TestTombstoneCost measures what the table holds per record: n completed
// records with a 200-byte body (the engine's encoding, with a
// Content-Type), in a table of this version and in one of the previous
// version (v2, without the keep columns), against n tombstones (the same
// records, freed by the purger), by information_schema's data_length and
// index_length after the table is rebuilt (OPTIMIZE TABLE: compact pages,
// as in a table whose freed space new rows reuse) and analyzed (ANALYZE
// TABLE), reported per 10,000 rows. It logs the numbers (go test -v shows
// them) and checks that a tombstone costs less than half a completed
// record, and a completed record no more than in a v2 table. n is 10,000,
// or 100,000 with IDEM_MYSQL_MEASURE=1 (the README's numbers: enough rows
// that InnoDB's allocation by 1 MiB extents does not dominate). Not
// parallel: its bulk writes would slow the other tests' statements down.
func TestTombstoneCost(t *testing.T) {
	n := 10_000
	if os.Getenv("IDEM_MYSQL_MEASURE") == "1" {
		n = 100_000
	}
	db := newDB(t)
	s, _ := newStore(t, db)
	// The engine's encoding of a 201 with a 200-byte JSON body.
	e, err := idem.New(s, idem.WithGlobalScope())
	if err != nil {
		t.Fatal(err)
	}
	req := request("size", `{}`)
	x, _ := e.Begin(ctxT(t), req)
	body := []byte(`{"id":"pay_1","status":"succeeded","amount":4200,"currency":"eur","note":"` + strings.Repeat("x", 200-76) + `"}`)
	if len(body) != 200 {
		t.Fatalf("body of %d bytes", len(body))
	}
	_, _ = x.Write(body)
	x.Finish(http.StatusCreated, http.Header{"Content-Type": {"application/json"}})
	rec, _, err := s.Get(ctxT(t), idem.ScopedKey(req.Principal, req.Method, req.Path, "size"))
	if err != nil || rec.State != idem.StateCompleted {
		t.Fatalf("Get = %+v, %v", rec, err)
	}
	encoded := rec.Response

	digits := "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
	seq := fmt.Sprintf("SELECT a.d + 10*b.d + 100*c.d + 1000*e.d + 10000*f.d AS n FROM %[1]s a, %[1]s b, %[1]s c, %[1]s e, %[1]s f HAVING n < %d", digits, n)
	exec := func(q string, args ...any) {
		t.Helper()
		rows, err := db.QueryContext(ctxT(t), q, args...)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// measure fills a new table with n completed rows as Complete writes
	// them (engine-sized keys, tokens and fingerprints), expiring at
	// expiresAt, under a tombstone keep of keepUS (0: none), purges it, and
	// returns its data_length per 10,000 rows.
	measure := func(what string, v2 bool, expiresAt string, keepUS int64) int64 {
		t.Helper()
		tbl := newTable(t, db)
		st := mysqlstore.New(db, mysqlstore.WithTable(tbl))
		defer st.Close()
		cols, vals, args := "", "", []any{encoded}
		if v2 {
			exec(v2Schema(tbl)[0])
		} else {
			if err := st.EnsureSchema(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			cols, vals, args = ", keep_tombstone", ", NULLIF(?, 0)", append(args, keepUS)
		}
		exec("INSERT INTO `"+tbl+"` (`key`, state, token, fingerprint, response, expires_at"+cols+") "+
			"SELECT SHA2(CONCAT('k', n), 256), 2, CONCAT(UPPER(LEFT(SHA2(CONCAT('t', n), 256), 26)), '.1'), SHA2(CONCAT('f', n), 256), ?, "+
			expiresAt+vals+" FROM ("+seq+") s", args...)
		if !v2 {
			if _, freed, err := mysqlstore.PurgeCounts(st, ctxT(t)); err != nil {
				t.Fatal(err)
			} else if want := map[bool]int64{true: int64(n)}[keepUS > 0]; freed != want {
				t.Fatalf("the purger freed %d tombstones; want %d", freed, want)
			}
		}
		var avgRow float64
		if err := db.QueryRowContext(ctxT(t), "SELECT AVG(LENGTH(`key`) + 1 + LENGTH(token) + LENGTH(fingerprint) + IFNULL(LENGTH(response), 0) + 8) FROM `"+tbl+"`").
			Scan(&avgRow); err != nil {
			t.Fatal(err)
		}
		if !v2 { // the keep columns' bytes
			var keepBytes float64
			if err := db.QueryRowContext(ctxT(t), "SELECT AVG(IF(ends_at IS NULL, 0, 8) + IF(keep_uncertain IS NULL, 0, 8) + IF(keep_tombstone IS NULL, 0, 8)) FROM `"+tbl+"`").
				Scan(&keepBytes); err != nil {
				t.Fatal(err)
			}
			avgRow += keepBytes
		}
		exec("OPTIMIZE TABLE `" + tbl + "`")
		exec("ANALYZE TABLE `" + tbl + "`")
		var data, index int64
		if err := db.QueryRowContext(ctxT(t), `SELECT DATA_LENGTH, INDEX_LENGTH FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`,
			tbl).Scan(&data, &index); err != nil {
			t.Fatal(err)
		}
		per := int64(n / 10_000)
		t.Logf("%-21s per 10k rows: data_length %8d B (%3d B/row), index_length %7d B (%3d B/row); column bytes %3.0f B/row",
			what, data/per, data/int64(n), index/per, index/int64(n), avgRow)
		return data / per
	}
	t.Logf("response: the engine's encoding of a 201 with a %d-byte body and a Content-Type: %d bytes", len(body), len(encoded))
	v2 := measure("completed (v2 table)", true, "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR", 0)
	completed := measure("completed", false, "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR", 0)
	tombstones := measure("tombstone", false, "UTC_TIMESTAMP(6) - INTERVAL 1 SECOND", time.Hour.Microseconds())
	if tombstones*2 > completed || completed > v2 {
		t.Fatalf("per 10k rows: tombstones %d B, completed records %d B, in a v2 table %d B; want tombstones below half, completed no more than v2",
			tombstones, completed, v2)
	}
}

// TestPurgeSpentTombstone: a completed row whose retention and tombstone
// keep both ended before any purge is freed and deleted by the same
// Purge (tests/model's TestModelMySQL found it left for the next one).
func TestPurgeSpentTombstone(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	s, table := newStore(t, db)
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.AcquireKeep(ctxT(t), key, tok, "fp", time.Minute, idem.Keep{Tombstone: time.Millisecond}); err != nil || !ok {
		t.Fatalf("AcquireKeep = %v, %v", ok, err)
	}
	if err := s.Complete(ctxT(t), key, tok, []byte("response"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	n, freed, err := mysqlstore.PurgeCounts(s, ctxT(t))
	if err != nil || n != 1 || freed != 1 {
		t.Fatalf("Purge = %d deleted, %d freed, %v; want the spent tombstone freed and deleted", n, freed, err)
	}
	if got := rowsIn(t, db, table); got != 0 {
		t.Fatalf("%d rows left after the purge", got)
	}
}
