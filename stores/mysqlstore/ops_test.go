package mysqlstore_test

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mysqlstore"
)

// rowsIn counts every row of table, expired or not.
func rowsIn(t testing.TB, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctxT(t), "SELECT count(*) FROM `"+table+"`").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPurge(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	s, table := newStore(t, db)
	resp := []byte("an encoded response") // opaque to the store
	live, expired := 0, 0
	for i := range 6 {
		key, tok := storetest.Key(), storetest.Token()
		lease := time.Minute
		if i%2 == 0 {
			lease = time.Millisecond
		}
		if _, ok, err := s.Acquire(ctxT(t), key, tok, "fp", lease); err != nil || !ok {
			t.Fatalf("Acquire = %v, %v", ok, err)
		}
		if i == 1 {
			if err := s.Complete(ctxT(t), key, tok, resp, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if i%2 == 0 {
			expired++
		} else {
			live++
		}
	}
	time.Sleep(10 * time.Millisecond)
	n, err := s.Purge(ctxT(t))
	if err != nil || n != int64(expired) {
		t.Fatalf("Purge = %d, %v; want %d expired rows deleted", n, err, expired)
	}
	if rows := rowsIn(t, db, table); rows != live {
		t.Fatalf("%d rows left; want the %d live ones", rows, live)
	}

	// More than a batch: Purge repeats until it is done.
	const many = mysqlstore.PurgeBatch + 7
	if _, err := db.ExecContext(ctxT(t), "INSERT INTO `"+table+"` (`key`, state, token, fingerprint, expires_at) "+
		"SELECT CONCAT('bulk-', seq), 1, 't', 'f', UTC_TIMESTAMP(6) - INTERVAL 1 SECOND FROM seq_1_to_"+fmt.Sprint(many)); err != nil {
		// seq_1_to_N is MariaDB's sequence engine; elsewhere insert in a loop.
		for i := range many {
			if _, err := db.ExecContext(ctxT(t), "INSERT INTO `"+table+"` (`key`, state, token, fingerprint, expires_at) VALUES (?, 1, 't', 'f', UTC_TIMESTAMP(6) - INTERVAL 1 SECOND)", fmt.Sprint("bulk-", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, err := s.Purge(ctxT(t)); err != nil || n != many {
		t.Fatalf("Purge of %d expired rows = %d, %v", many, n, err)
	}
	if rows := rowsIn(t, db, table); rows != live {
		t.Fatalf("%d rows left; want the %d live ones", rows, live)
	}

	// The purge's read can use the expires_at index (EXPLAIN's "key"
	// column; MySQL and MariaDB differ in the other columns).
	rows, err := db.QueryContext(ctxT(t), "EXPLAIN SELECT `key` FROM `"+table+"` FORCE INDEX (`"+table+"_expires_at`) WHERE expires_at <= UTC_TIMESTAMP(6) ORDER BY expires_at LIMIT 1000")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if !rows.Next() {
		t.Fatal("EXPLAIN returned no row")
	}
	if err := rows.Scan(ptrs...); err != nil {
		t.Fatal(err)
	}
	i := slices.Index(cols, "key")
	if i < 0 || vals[i].String != table+"_expires_at" {
		t.Fatalf("purge plan %v = %v; want key %s_expires_at", cols, vals, table)
	}
}

func TestPurger(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	s, table := newStore(t, db)
	if _, ok, err := s.Acquire(ctxT(t), storetest.Key(), "tok", "fp", time.Millisecond); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if err := s.StartPurger(0); !errors.Is(err, idem.ErrInvalidDuration) {
		t.Fatalf("StartPurger(0) = %v", err)
	}
	if err := s.StartPurger(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := s.StartPurger(200 * time.Millisecond); err == nil {
		t.Fatal("second StartPurger succeeded")
	}
	deadline := time.Now().Add(2 * time.Minute) // a hang guard: the purger runs every 200ms
	for rowsIn(t, db, table) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the purger did not delete the expired row within 2 minutes")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.StartPurger(time.Second); err == nil {
		t.Fatal("StartPurger after Close succeeded")
	}
	_ = s.Close() // twice is fine; goleak checks the goroutine is gone
	// The store stays usable after Close: statements are prepared again.
	if _, ok, err := s.Acquire(ctxT(t), storetest.Key(), "tok", "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire after Close = %v, %v", ok, err)
	}
}

// TestEnsureSchemaConcurrent starts several instances at once on a new
// table, then replaces a procedure of this version's name with another
// body.
func TestEnsureSchemaConcurrent(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	table := newTable(t, db)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := mysqlstore.New(db, mysqlstore.WithTable(table)).EnsureSchema(ctxT(t)); err != nil {
				t.Errorf("EnsureSchema: %v", err)
			}
		})
	}
	wg.Wait()
	s := mysqlstore.New(db, mysqlstore.WithTable("test."+table)) // qualified: the same table
	defer s.Close()
	if _, ok, err := s.Acquire(ctxT(t), storetest.Key(), "tok", "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire on the ensured table = %v, %v", ok, err)
	}
	// A procedure of this name with another body (another comment) is replaced.
	if _, err := db.ExecContext(ctxT(t), "DROP PROCEDURE `"+table+mysqlstore.ProcSuffix+"`"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctxT(t), "CREATE PROCEDURE `"+table+mysqlstore.ProcSuffix+"`(IN a VARBINARY(255), IN b VARBINARY(255), IN c VARBINARY(255), IN d BIGINT) COMMENT 'old' SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureSchema(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Acquire(ctxT(t), storetest.Key(), "tok", "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire after the upgrade = %v, %v", ok, err)
	}
	if n := len(s.SchemaSQL()); n != 3 {
		t.Fatalf("SchemaSQL: %d statements; want 3", n)
	}
}

// TestBadInput: ids longer than the columns are refused before any I/O
// (never truncated into another key), a missing table is a clear error,
// and a row this package did not write is reported as corrupt.
func TestBadInput(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	s, table := newStore(t, db)
	long := strings.Repeat("k", mysqlstore.MaxIDLength+1)
	if _, _, err := s.Acquire(ctxT(t), long, "tok", "fp", time.Minute); !errors.Is(err, mysqlstore.ErrInvalidID) {
		t.Fatalf("Acquire with a %d-byte key = %v; want ErrInvalidID", len(long), err)
	}
	if _, _, err := s.Acquire(ctxT(t), storetest.Key(), long, "fp", time.Minute); !errors.Is(err, mysqlstore.ErrInvalidID) {
		t.Fatalf("Acquire with a long token = %v; want ErrInvalidID", err)
	}
	if err := s.Complete(ctxT(t), storetest.Key(), long, []byte("r"), time.Hour); !errors.Is(err, mysqlstore.ErrInvalidID) {
		t.Fatalf("Complete with a long token = %v; want ErrInvalidID", err)
	}
	if rows := rowsIn(t, db, table); rows != 0 {
		t.Fatalf("%d rows after refused calls", rows)
	}

	key := storetest.Key()
	if _, err := db.ExecContext(ctxT(t), "INSERT INTO `"+table+"` (`key`, state, token, fingerprint, response, expires_at) VALUES (?, 2, 't', 'f', 'not an encoding', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)", key); err != nil {
		t.Fatal(err)
	}
	// The response bytes are opaque to the store: a foreign value is handed
	// out as it is, and the engine answers 500 on bytes it cannot decode.
	if rec, _, err := s.Get(ctxT(t), key); err != nil || string(rec.Response) != "not an encoding" {
		t.Fatalf("Get of a foreign response = %q, %v; want its bytes unchanged", rec.Response, err)
	}
	e, err := idem.New(s, idem.WithGlobalScope())
	if err != nil {
		t.Fatal(err)
	}
	key2 := storetest.Key()
	if _, err := db.ExecContext(ctxT(t), "INSERT INTO `"+table+"` (`key`, state, token, fingerprint, expires_at) VALUES (?, 7, 't', 'f', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)", key2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Acquire(ctxT(t), key2, "tok", "f", time.Minute); !errors.Is(err, idem.ErrCorrupt) {
		t.Fatalf("Acquire of a row with state 7 = %v; want ErrCorrupt", err)
	}
	_ = e

	missing := mysqlstore.New(db, mysqlstore.WithTable("idem_no_such_table_"+strings.ToLower(storetest.Token()[:8])))
	defer missing.Close()
	if _, _, err := missing.Acquire(ctxT(t), storetest.Key(), "tok", "fp", time.Minute); err == nil || !strings.Contains(err.Error(), "mysqlstore: acquire") {
		t.Fatalf("Acquire without the schema = %v; want a wrapped server error", err)
	}
}

// TestTooLarge: a response over the server's max_allowed_packet is
// refused as ErrTooLarge, nothing is written, and the owner still holds
// its lease (the engine then stores a small problem instead).
func TestTooLarge(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	s, _ := newStore(t, db)
	var maxPacket int
	if err := db.QueryRowContext(ctxT(t), `SELECT @@max_allowed_packet`).Scan(&maxPacket); err != nil {
		t.Fatal(err)
	}
	if maxPacket > 64<<20 {
		t.Fatalf("max_allowed_packet is %d bytes; this test needs a server at 64 MiB or less", maxPacket)
	}
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctxT(t), key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	big := bytes.Repeat([]byte("x"), maxPacket+1)
	err := s.Complete(ctxT(t), key, tok, big, time.Hour)
	t.Logf("Complete of %d bytes: %v", len(big), err)
	if !errors.Is(err, idem.ErrTooLarge) {
		t.Fatalf("Complete of %d bytes = %v; want ErrTooLarge", len(big), err)
	}
	if rec, found, err := s.Get(ctxT(t), key); err != nil || !found || rec.State != idem.StateInProgress || rec.Token != tok {
		t.Fatalf("after the refused completion Get = %+v, %v, %v; want the owner's in-progress record", rec, found, err)
	}
	if err := s.Complete(ctxT(t), key, tok, []byte("small"), time.Hour); err != nil {
		t.Fatalf("the owner's smaller completion: %v", err)
	}
}

// handler serves POST /v1/payments through e: it inserts the payment row
// through the execution's transaction, takes delay, and answers 201.
func handler(t testing.TB, e *idem.Engine, payments string, delay time.Duration, executions *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x, resp := e.BeginHTTP(r, "/v1/payments", r.Header.Get("X-Principal"))
		if resp != nil {
			resp.Send(w)
			return
		}
		ctx := x.WithInfo(r.Context())
		n := executions.Add(1)
		tx, err := mysqlstore.Tx(ctx)
		if err == nil {
			err = insertPayment(ctx, tx, payments, r.Header.Get("Idempotency-Key"))
		}
		if err != nil {
			t.Errorf("handler write: %v", err)
			x.Finish(500, nil)
			w.WriteHeader(500)
			return
		}
		time.Sleep(delay)
		out := fmt.Appendf(nil, `{"id":"pay_%d"}`, n)
		w.Header().Set("Content-Type", "application/json")
		x.Write(out)
		x.Finish(http.StatusCreated, w.Header())
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(out)
	})
}

type answer struct {
	status     int
	replayed   bool
	body       string
	retryAfter string // the Retry-After header
}

// retryBudget is how long a test retries idem's retryable answers, as a
// client would: a hang guard sized for a loaded machine, not a speed check.
const retryBudget = 2 * time.Minute

// retryable reports whether a is an answer idem documents as retryable:
// 503 store-unavailable or 409 in-progress, each with Retry-After (a 409
// without it is operation-uncertain, for an operator).
func (a answer) retryable() bool {
	return (a.status == http.StatusServiceUnavailable || a.status == http.StatusConflict) && a.retryAfter != ""
}

// postRetrying posts like a client that retries idem's retryable answers
// (409 in progress; 503 when a store call outran the store timeout on a
// loaded machine) every 50ms for up to retryBudget; it returns the first
// other answer, or the transport's error, and the number of retries.
func postRetrying(client *http.Client, url, key, body string) (answer, int, error) {
	deadline := time.Now().Add(retryBudget)
	for retries := 0; ; retries++ {
		a, err := post(client, url, key, body)
		if err != nil || !a.retryable() || time.Now().After(deadline) {
			return a, retries, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func post(client *http.Client, url, key, body string) (answer, error) {
	req, err := http.NewRequest("POST", url+"/v1/payments", strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Principal", "alice")
	res, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, replayed: res.Header.Get(idem.ReplayedHeader) == "true", body: string(b),
		retryAfter: res.Header.Get("Retry-After")}, err
}

// TestMultiInstance sends 60 concurrent duplicates spread over three
// instances, each with its own *sql.DB and engine on one table, one of
// them at READ COMMITTED, each client retrying 409s and 503s as
// documented: one execution, one payment row, every other client answered
// its replay.
func TestMultiInstance(t *testing.T) {
	t.Parallel()
	db0 := newDB(t)
	_, table := newStore(t, db0)
	payments := createPayments(t, db0, table)
	var executions atomic.Int32
	var urls []string
	for i := range 3 {
		level := ""
		if i == 2 {
			level = "READ-COMMITTED"
		}
		// A store timeout no store call outruns on a loaded machine: a
		// completion that timed out would leave the key to a second
		// execution after the lease.
		e, err := idem.New(mysqlstore.New(newDB(t, isolation(t, level)), mysqlstore.WithTable(table)),
			idem.WithLease(2*time.Minute), idem.WithStoreTimeout(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(handler(t, e, payments, 100*time.Millisecond, &executions))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: time.Minute}
	defer client.CloseIdleConnections()

	const n = 60
	key, body := "order-"+storetest.Token(), `{"amount":4200,"currency":"EUR"}`
	answers := make([]answer, n)
	var (
		wg      sync.WaitGroup
		retries atomic.Int32
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			time.Sleep(time.Duration(i%6) * 40 * time.Millisecond) // spread over 200ms: some during, some after the execution
			a, r, err := postRetrying(client, urls[i%3], key, body)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			answers[i] = a
			retries.Add(int32(r))
		})
	}
	close(start)
	wg.Wait()

	if got := executions.Load(); got != 1 {
		t.Fatalf("%d executions for %d duplicates over 3 instances; want exactly 1", got, n)
	}
	var originals, replays int
	var original string
	for i, a := range answers {
		switch {
		case a.status == 201 && !a.replayed:
			originals++
			original = a.body
		case a.status == 201 && a.replayed:
			replays++
		default:
			t.Errorf("request %d answered %d %q; want 201 or its replay", i, a.status, a.body)
		}
	}
	if originals != 1 {
		t.Fatalf("%d first-execution answers; want 1", originals)
	}
	for i, a := range answers {
		if a.replayed && a.body != original {
			t.Errorf("replay %d body %q; want the original %q", i, a.body, original)
		}
	}
	if rows := countRows(t, db0, payments, key); rows != 1 {
		t.Fatalf("%d payment rows; want 1", rows)
	}
	t.Logf("%d duplicates: 1 execution, 1 payment row, %d replays after %d retried 409s and 503s", n, replays, retries.Load())
}

// TestOutage cuts every connection to the server through a proxy and lets
// them through again (storetest.RunOutage).
func TestOutage(t *testing.T) {
	t.Parallel()
	storetest.RunOutage(t, func(t *testing.T) storetest.Outage {
		direct := newDB(t)
		_, table := newStore(t, direct)
		p := storetest.NewProxy(t, config(t).Addr)
		db := newDB(t, func(c *mysql.Config) {
			c.Net, c.Addr = "tcp", p.Addr()
			c.Timeout = 500 * time.Millisecond
		})
		return storetest.Outage{Store: mysqlstore.New(db, mysqlstore.WithTable(table)), Cut: p.Cut, Restore: p.Restore}
	})
}

// TestHappyPathUnderLoad runs many transactional executions at once on
// fresh keys (adjacent in the primary key, so gap locks would meet), with
// duplicates and a purger deleting expired rows between them, at
// REPEATABLE READ: every execution completes (no deadlock, no lock wait
// timeout, no 503), each with exactly its one payment row. The store
// timeout is one no store call outruns on a loaded machine (InnoDB reports
// a deadlock at once, and waits for a lock up to its 50s timeout).
func TestHappyPathUnderLoad(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	s, table := newStore(t, db)
	payments := createPayments(t, db, table)
	if err := s.StartPurger(5 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s, idem.WithGlobalScope(), idem.WithLease(2*time.Minute), idem.WithStoreTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	const workers, perWorker = 8, 20
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				// Expired neighbours for the purger, between the live keys.
				_, _, _ = s.Acquire(ctxT(t), fmt.Sprintf("k-%02d-%03d-x", w, i), "gone", "fp", time.Microsecond)
				key := fmt.Sprintf("k-%02d-%03d", w, i)
				for dup := range 2 { // the second is a replay
					x, resp := e.Begin(ctxT(t), request(key, `{}`))
					if x == nil {
						if dup == 0 || resp.Status != 201 || !resp.IsReplay() {
							t.Errorf("%s copy %d: %d %s", key, dup, resp.Status, resp.Body)
						}
						continue
					}
					ctx := x.WithInfo(ctxT(t))
					tx, err := mysqlstore.Tx(ctx)
					if err == nil {
						err = insertPayment(ctx, tx, payments, key)
					}
					if err != nil {
						t.Errorf("%s: %v", key, err)
						x.Fail()
						continue
					}
					x.Write([]byte("ok"))
					x.Finish(201, nil)
				}
			}
		})
	}
	wg.Wait()
	var rows, keys int
	if err := db.QueryRowContext(ctxT(t), "SELECT count(*), count(DISTINCT idem_key) FROM `"+payments+"`").Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	if rows != workers*perWorker || keys != rows {
		t.Fatalf("%d payment rows for %d keys; want %d, one per key", rows, keys, workers*perWorker)
	}
}
