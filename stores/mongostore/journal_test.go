package mongostore_test

import (
	"context"
	"encoding/hex"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mongostore"
)

// TestJournalDocument checks a record's journal as stored (fields of its
// document), and how the record reads once its lease lapsed: in progress
// for Get, List and Evict (not uncertain), until its retain ends; a
// tombstone carries no journal.
func TestJournalDocument(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	t.Cleanup(func() { s.Close() })
	ctx := ctxT(t)
	key, tok := storetest.Key(), storetest.Token()
	// A lease no loaded machine outruns before the steps are written; it
	// is cut short below.
	if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if _, err := s.StartStep(ctx, key, tok, "charge.v1", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishStep(ctx, key, tok, "charge.v1", []byte{0, 0xff}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Steps map[string]struct {
			I int32  `bson:"i"`
			T string `bson:"t"`
			D bool   `bson:"d"`
			R []byte `bson:"r"`
		} `bson:"steps"`
		NSteps    int32         `bson:"nsteps"`
		Retain    int64         `bson:"retain"`
		Until     bson.DateTime `bson:"until"`
		ExpiresAt bson.DateTime `bson:"expiresAt"`
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	entry, ok := doc.Steps[hex.EncodeToString([]byte("charge.v1"))]
	if !ok || entry.I != 0 || entry.T != tok || !entry.D || string(entry.R) != "\x00\xff" || doc.Retain != 3600000 || doc.NSteps != 1 ||
		doc.ExpiresAt.Time().Sub(doc.Until.Time()) != time.Hour {
		t.Fatalf("document of a record with a journal = %+v; want steps.<hex name> {i t d r}, nsteps 1, retain 3600000, expiresAt = until + 1h", doc)
	}
	if err := s.Extend(ctx, key, tok, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the lease lapses
	if rec, found, err := s.Get(ctx, key); err != nil || !found || rec.State != idem.StateInProgress {
		t.Fatalf("Get of a lapsed record with a journal = %+v, %v, %v; want in progress", rec, found, err)
	}
	page, err := s.List(ctx, idem.ListQuery{KeyPrefix: key, Limit: 10})
	if err != nil || len(page.Records) != 1 || page.Records[0].State != idem.StateInProgress {
		t.Fatalf("List of a lapsed record with a journal = %+v, %v; want it in progress", page.Records, err)
	}
	if err := s.Evict(ctx, key, idem.Record{State: idem.StateUncertain, Token: tok, Fingerprint: "fp"}); err == nil {
		t.Fatal("Evict of a lapsed record with a journal seen uncertain succeeded")
	}
	if err := s.Evict(ctx, key, idem.Record{State: idem.StateInProgress, Token: tok, Fingerprint: "fp"}); err != nil {
		t.Fatalf("Evict of a lapsed record with a journal seen in progress: %v", err)
	}
	if st, err := s.Steps(ctx, key); err != nil || st != nil {
		t.Fatalf("Steps after Evict = %+v, %v", st, err)
	}

	// A tombstone has no journal: Steps answers none, and the first read
	// that finds it frees its journal with its response.
	key, tok = storetest.Key(), storetest.Token()
	if _, ok, err := s.AcquireKeep(ctx, key, tok, "fp", time.Minute, idem.Keep{Tombstone: time.Hour}); err != nil || !ok {
		t.Fatalf("AcquireKeep = %v, %v", ok, err)
	}
	if _, err := s.StartStep(ctx, key, tok, "charge", time.Hour); err != nil {
		t.Fatal(err)
	}
	const retention = 2 * time.Second
	completing := time.Now() // before the completion sets the retention: the check within it holds however slow Complete is
	if err := s.Complete(ctx, key, tok, []byte("resp"), retention); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Steps(ctx, key); time.Since(completing) < retention && (err != nil || len(st) != 1) {
		t.Fatalf("Steps of the completed record = %+v, %v", st, err)
	}
	time.Sleep(retention + 200*time.Millisecond) // after the completion: past its retention
	if st, err := s.Steps(ctx, key); err != nil || st != nil {
		t.Fatalf("Steps of a tombstone = %+v, %v; want none", st, err)
	}
	if rec, _, err := s.Get(ctx, key); err != nil || rec.State != idem.StateExpired {
		t.Fatalf("Get of the tombstone = %+v, %v", rec, err)
	}
	var tomb bson.Raw
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&tomb); err != nil {
		t.Fatal(err)
	}
	if _, err := tomb.LookupErr("steps"); err == nil {
		t.Fatalf("tombstone document = %v; want its journal freed", tomb)
	}
}

// TestJournalRoundTrips counts the commands of the journal's paths with the
// driver's command monitor, and checks that a handler using no step pays
// nothing for them.
func TestJournalRoundTrips(t *testing.T) {
	var mu sync.Mutex
	var cmds []string
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		mu.Lock()
		cmds = append(cmds, e.CommandName)
		mu.Unlock()
	}}
	c := connect(t, options.Client().SetMonitor(mon))
	coll := c.Database(testDB).Collection(randomName("jrt_"))
	t.Cleanup(func() { drop(coll) })
	s := mongostore.New(coll, mongostore.WithClockRefresh(time.Hour))
	t.Cleanup(func() { s.Close() })
	ctx := ctxT(t)
	if _, _, err := s.Get(ctx, "warm-up"); err != nil { // reads the server clock
		t.Fatal(err)
	}
	expect := func(what string, f func() error, want ...string) {
		t.Helper()
		mu.Lock()
		cmds = nil
		mu.Unlock()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(cmds, want) {
			t.Errorf("%s sent %v; want %v", what, cmds, want)
		}
	}
	key, tok := storetest.Key(), storetest.Token()
	expect("Acquire", func() error { _, _, err := s.Acquire(ctx, key, tok, "fp", time.Minute); return err }, "findAndModify")
	expect("first StartStep", func() error { _, err := s.StartStep(ctx, key, tok, "a", time.Hour); return err }, "find", "update")
	expect("FinishStep", func() error { return s.FinishStep(ctx, key, tok, "a", []byte("x")) }, "update")
	expect("next StartStep", func() error { _, err := s.StartStep(ctx, key, tok, "b", time.Hour); return err }, "update")
	expect("StartStep of a started step", func() error { _, err := s.StartStep(ctx, key, tok, "a", time.Hour); return err }, "update", "find")
	expect("Extend", func() error { return s.Extend(ctx, key, tok, time.Minute) }, "update")
	expect("Complete", func() error { return s.Complete(ctx, key, tok, []byte("r"), time.Hour) }, "update")
	expect("Steps", func() error { _, err := s.Steps(ctx, key); return err }, "find")
	key, tok = storetest.Key(), storetest.Token()
	expect("Acquire without steps", func() error { _, _, err := s.Acquire(ctx, key, tok, "fp", time.Minute); return err }, "findAndModify")
	expect("Complete without steps", func() error { return s.Complete(ctx, key, tok, []byte("r"), time.Hour) }, "update")
}

// TestJournalConcurrentSteps runs steps of one execution concurrently
// (different names, as idem.Step allows): on a server whose updates read
// and then replace the document (FerretDB), unserialised journal writes
// of one owner would lose entries.
func TestJournalConcurrentSteps(t *testing.T) {
	c, _ := shared(t)
	s := mongostore.New(collection(t, c))
	t.Cleanup(func() { s.Close() })
	ctx := ctxT(t)
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := string(rune('a' + i))
			if _, err := s.StartStep(ctx, key, tok, name, time.Hour); err != nil {
				t.Errorf("StartStep(%s): %v", name, err)
				return
			}
			if err := s.FinishStep(ctx, key, tok, name, []byte(name)); err != nil {
				t.Errorf("FinishStep(%s): %v", name, err)
			}
		}()
	}
	wg.Wait()
	st, err := s.Steps(ctx, key)
	if err != nil || len(st) != n {
		t.Fatalf("Steps = %+v, %v; want %d", st, err, n)
	}
	seen := map[string]bool{}
	for _, e := range st {
		if !e.Done || string(e.Result) != e.Name || seen[e.Name] {
			t.Fatalf("Steps = %+v; want each step once, done with its own result", st)
		}
		seen[e.Name] = true
	}
}
