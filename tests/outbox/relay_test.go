package outboxtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/outbox"
)

var quiet = slog.New(slog.DiscardHandler)

var dialects = []outbox.Dialect{outbox.PostgreSQL, outbox.MySQL}

// recorder is a Publisher keeping what it was given, in order, and
// failing when two relays publish one message at the same time. It
// stands for the broker where the property under test is the relay's
// claim discipline (the database's locks), not the broker.
type recorder struct {
	mu        sync.Mutex
	inFlight  map[string]bool
	published []outbox.Message
	overlaps  atomic.Int64
	failEvery int // every n-th Publish fails (0: none)
	calls     int
}

func newRecorder() *recorder { return &recorder{inFlight: map[string]bool{}} }

var errBrokerDown = errors.New("broker down")

func (r *recorder) Publish(ctx context.Context, m outbox.Message) error {
	r.mu.Lock()
	r.calls++
	if r.failEvery > 0 && r.calls%r.failEvery == 0 {
		r.mu.Unlock()
		return errBrokerDown
	}
	if r.inFlight[m.ID] {
		r.overlaps.Add(1)
	}
	r.inFlight[m.ID] = true
	r.mu.Unlock()
	time.Sleep(100 * time.Microsecond) // a window for an overlap to show
	r.mu.Lock()
	delete(r.inFlight, m.ID)
	r.published = append(r.published, m)
	r.mu.Unlock()
	return nil
}

// batchRecorder is a recorder with PublishBatch, failing when a batch
// holds two messages of one key.
type batchRecorder struct{ *recorder }

func (b batchRecorder) PublishBatch(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	keys := map[string]bool{}
	for _, m := range msgs {
		if m.Key != "" && keys[m.Key] {
			b.overlaps.Add(1)
		}
		keys[m.Key] = m.Key != ""
	}
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = b.Publish(ctx, m) }()
	}
	wg.Wait()
	return errs
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.published)
}

// enqueue commits n messages over keys keys (message i: key i%keys,
// payload i), in transactions of 1 to 3 messages; transactions holding a
// message i with i%10 == 9 roll back. It returns the committed ids.
func enqueue(t testing.TB, db *sql.DB, ob *outbox.Outbox, n, keys int) map[string]bool {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	ids := paymentIDs(n)
	committed := map[string]bool{}
	for i := 0; i < n; {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		size := 1 + i%3
		var msgs []outbox.Message
		rollback := false
		for j := i; j < min(n, i+size); j++ {
			msgs = append(msgs, outbox.Message{ID: ids[j], Key: fmt.Sprintf("k%d", j%keys), Subject: "payment.created", Payload: fmt.Appendf(nil, "%d", j)})
			rollback = rollback || j%10 == 9
		}
		if err := ob.Enqueue(ctx, tx, msgs...); err != nil {
			t.Fatal(err)
		}
		if rollback {
			err = tx.Rollback()
		} else {
			err = tx.Commit()
			for _, m := range msgs {
				committed[m.ID] = true
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		i += size
	}
	return committed
}

// TestRelays runs one, two and three relays (two workers each) on one
// outbox while a tenth of the publishes fail, with a Publisher and with a
// BatchPublisher (waves of distinct keys, published concurrently): every
// committed message is published exactly once, never two at a time, in
// order per key; no rolled-back one is.
func TestRelays(t *testing.T) {
	for _, d := range dialects {
		for _, relays := range []int{1, 2, 3} {
			for _, batch := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%d/batch=%v", d, relays, batch), func(t *testing.T) {
					t.Parallel()
					db, _ := openDB(t, d)
					ob := newOutbox(t, db, d, outbox.WithPartitions(8))
					committed := enqueue(t, db, ob, 300, 12)
					rec := newRecorder()
					rec.failEvery = 10
					var pub outbox.Publisher = rec
					if batch {
						pub = batchRecorder{rec}
					}
					ctx, cancel := context.WithCancel(context.Background())
					var wg sync.WaitGroup
					for range relays {
						r, err := outbox.NewRelay(db, ob, pub, outbox.WithWorkers(2), outbox.WithBatchSize(7), outbox.WithLogger(quiet),
							outbox.WithPollInterval(10*time.Millisecond), outbox.WithBackoff(time.Millisecond, 20*time.Millisecond))
						if err != nil {
							t.Fatal(err)
						}
						wg.Add(1)
						go func() { defer wg.Done(); _ = r.Run(ctx) }()
					}
					waitFor(t, "an empty outbox", 60*time.Second, func() bool { return unsent(t, db, ob.Table()) == 0 })
					cancel()
					wg.Wait()
					seen := map[string]int{}
					last := map[string]int{}
					for _, m := range rec.published {
						seen[m.ID]++
						var i int
						_, _ = fmt.Sscan(string(m.Payload), &i)
						if prev, ok := last[m.Key]; ok && prev >= i {
							t.Errorf("key %s: message %d published after %d", m.Key, i, prev)
						}
						last[m.Key] = i
						if !committed[m.ID] {
							t.Errorf("message %s of a rolled-back transaction published", m.ID)
						}
					}
					for id := range committed {
						if seen[id] != 1 {
							t.Errorf("message %s published %d times, want 1", id, seen[id])
						}
					}
					if n := rec.overlaps.Load(); n > 0 {
						t.Errorf("%d messages published by two relays at once", n)
					}
					if len(seen) != len(committed) {
						t.Errorf("%d distinct messages published, %d committed", len(seen), len(committed))
					}
				})
			}
		}
	}
}

// TestPurgeAndPending checks Pending's count and oldest age, and that
// Purge deletes only messages sent more than the retention ago.
func TestPurgeAndPending(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			db, _ := openDB(t, d)
			ob := newOutbox(t, db, d)
			ctx := ctxT(t, 60*time.Second)
			committed := enqueue(t, db, ob, 20, 3)
			rec := newRecorder()
			r, err := outbox.NewRelay(db, ob, rec, outbox.WithRetention(time.Hour), outbox.WithLogger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			n, oldest, err := r.Pending(ctx)
			if err != nil || n != int64(len(committed)) || oldest <= 0 {
				t.Fatalf("Pending = %d, %v, %v; want %d, > 0, nil", n, oldest, err, len(committed))
			}
			for rec.count() < len(committed) {
				if _, err := r.RelayOnce(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if n, oldest, err := r.Pending(ctx); err != nil || n != 0 || oldest != 0 {
				t.Fatalf("Pending after relaying = %d, %v, %v; want 0, 0, nil", n, oldest, err)
			}
			if p, err := r.RelayOnce(ctx); p != 0 || err != nil {
				t.Fatalf("RelayOnce on an empty outbox = %d, %v", p, err)
			}
			if purged, err := r.Purge(ctx); err != nil || purged != 0 {
				t.Fatalf("Purge within the retention = %d, %v; want 0", purged, err)
			}
			fresh := enqueue(t, db, ob, 5, 1) // unsent: never purged
			rows := func() int {
				var n int
				if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+ob.Table()).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			short, err := outbox.NewRelay(db, ob, rec, outbox.WithRetention(time.Millisecond), outbox.WithLogger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the sent messages purged after the retention", 30*time.Second, func() bool {
				if _, err := short.Purge(ctx); err != nil {
					t.Fatal(err)
				}
				return rows() == len(fresh)
			})
			if n := unsent(t, db, ob.Table()); n != len(fresh) {
				t.Fatalf("%d unsent rows after the purge, want %d", n, len(fresh))
			}
		})
	}
}

// TestInvalid checks configuration and message errors, and that a message
// ID enqueued twice fails the second transaction.
func TestInvalid(t *testing.T) {
	for _, opts := range [][]outbox.Option{{outbox.WithTable("a-b")}, {outbox.WithTable("")}, {outbox.WithPartitions(0)},
		{outbox.WithTable("s.")}, {outbox.WithTable(".t")}, {outbox.WithTable("a.b.c")}, {outbox.WithTable("s-x.t")}} {
		if _, err := outbox.New(outbox.PostgreSQL, opts...); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("New with a bad option: %v, want ErrInvalidConfig", err)
		}
	}
	if _, err := outbox.New(outbox.Dialect(9)); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("New(Dialect(9)): %v, want ErrInvalidConfig", err)
	}
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			db, _ := openDB(t, d)
			ob := newOutbox(t, db, d)
			ctx := ctxT(t, 30*time.Second)
			if _, err := outbox.NewRelay(db, ob, newRecorder(), outbox.WithBatchSize(0)); !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Errorf("NewRelay with batch size 0: %v", err)
			}
			if _, err := outbox.NewRelay(nil, ob, newRecorder()); !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Errorf("NewRelay without a database: %v", err)
			}
			long := string(make([]byte, 256))
			for _, m := range []outbox.Message{{Subject: "s"}, {ID: "x"}, {ID: long, Subject: "s"}, {ID: "x", Subject: "s", Key: long}} {
				if err := ob.Enqueue(ctx, db, m); !errors.Is(err, outbox.ErrInvalidMessage) {
					t.Errorf("Enqueue(%.20q): %v, want ErrInvalidMessage", m.ID, err)
				}
			}
			m := outbox.Message{ID: "dup", Subject: "s"}
			if err := ob.Enqueue(ctx, db, m); err != nil {
				t.Fatal(err)
			}
			if err := ob.Enqueue(ctx, db, m); err == nil {
				t.Error("a message ID enqueued twice: no error")
			}
			if n := unsent(t, db, ob.Table()); n != 1 {
				t.Errorf("%d rows, want 1", n)
			}
		})
	}
}

// TestSchemaQualifiedTable runs an outbox whose WithTable names a schema
// ("schema.table"; on MySQL the database): EnsureSchema creates both
// tables in that schema, and messages enqueued there are relayed, counted
// and purged.
func TestSchemaQualifiedTable(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			db, _ := openDB(t, d)
			ctx := ctxT(t, 60*time.Second)
			var schema string
			if d == outbox.PostgreSQL { // a schema of its own, not on the search_path
				schema = uniq("s")
				if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
			} else if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&schema); err != nil {
				t.Fatal(err)
			}
			table := uniq("t")
			ob, err := outbox.New(d, outbox.WithTable(schema+"."+table))
			if err != nil {
				t.Fatal(err)
			}
			if ob.Table() != schema+"."+table {
				t.Errorf("Table() = %q, want %q", ob.Table(), schema+"."+table)
			}
			if err := ob.EnsureSchema(ctx, db); err != nil {
				t.Fatal(err)
			}
			if d == outbox.MySQL {
				t.Cleanup(func() { dropTables(db, table, table+"_partitions") })
			}
			if err := ob.EnsureSchema(ctx, db); err != nil { // again, as every process does at start
				t.Fatalf("EnsureSchema a second time: %v", err)
			}
			var n int
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_schema = "+ph(d, 1)+" AND table_name IN ("+ph(d, 2)+", "+ph(d, 3)+")",
				schema, table, table+"_partitions").Scan(&n); err != nil || n != 2 {
				t.Fatalf("tables in %s: %d, %v; want the outbox and its partitions", schema, n, err)
			}
			committed := enqueue(t, db, ob, 10, 2)
			rec := newRecorder()
			r, err := outbox.NewRelay(db, ob, rec, outbox.WithRetention(time.Millisecond), outbox.WithLogger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			if p, _, err := r.Pending(ctx); err != nil || p != int64(len(committed)) {
				t.Fatalf("Pending = %d, %v; want %d", p, err, len(committed))
			}
			for rec.count() < len(committed) {
				if _, err := r.RelayOnce(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for _, m := range rec.published {
				if !committed[m.ID] {
					t.Errorf("published %s, which was not committed", m.ID)
				}
			}
			waitFor(t, "the sent messages purged", 30*time.Second, func() bool {
				if _, err := r.Purge(ctx); err != nil {
					t.Fatal(err)
				}
				var left int
				if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+ob.Table()).Scan(&left); err != nil {
					t.Fatal(err)
				}
				return left == 0
			})
		})
	}
}

// ph is dialect d's n-th placeholder.
func ph(d outbox.Dialect, n int) string {
	if d == outbox.MySQL {
		return "?"
	}
	return fmt.Sprintf("$%d", n)
}
