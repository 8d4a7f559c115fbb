package mongostore_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mongostore"
)

// rawRecord returns key's stored document.
func rawRecord(t *testing.T, coll *mongo.Collection, key string) bson.Raw {
	t.Helper()
	raw, err := coll.FindOne(ctxT(t), bson.D{{Key: "_id", Value: key}}).Raw()
	if err != nil {
		t.Fatalf("record %s: %v", key[:8], err)
	}
	return raw
}

// tombstone returns a key whose record, completed under Keep.Tombstone = keep
// with response, is past its 100 ms retention: a tombstone, not yet read.
func tombstone(t *testing.T, s *mongostore.Store, response []byte, keep time.Duration) string {
	t.Helper()
	return tombstoneFP(t, s, "fp", response, keep)
}

// tombstoneFP is tombstone with the fingerprint fp.
func tombstoneFP(t *testing.T, s *mongostore.Store, fp string, response []byte, keep time.Duration) string {
	t.Helper()
	ctx := ctxT(t)
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.AcquireKeep(ctx, key, tok, fp, time.Minute, idem.Keep{Tombstone: keep}); err != nil || !ok {
		t.Fatalf("AcquireKeep = %v, %v", ok, err)
	}
	if err := s.Complete(ctx, key, tok, response, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	return key
}

// TestKeepLayout checks the stored shape: a record acquired without a Keep
// has exactly the fields of the previous version (no until, keepU, keepT),
// so either version reads the other's records; one under a Keep holds them,
// expiresAt at the end of its keep (for the TTL index).
func TestKeepLayout(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	plain, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, plain, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	fields := func(raw bson.Raw) []string {
		elems, _ := raw.Elements()
		var names []string
		for _, e := range elems {
			names = append(names, e.Key())
		}
		slices.Sort(names) // FerretDB reorders fields
		return names
	}
	if got, want := fields(rawRecord(t, coll, plain)), []string{"_id", "expiresAt", "fingerprint", "gen", "state", "token"}; !slices.Equal(got, want) {
		t.Fatalf("in-progress record without a Keep has fields %v; want %v", got, want)
	}
	if err := s.Complete(ctx, plain, tok, []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, want := fields(rawRecord(t, coll, plain)), []string{"_id", "expiresAt", "fingerprint", "gen", "response", "state", "token"}; !slices.Equal(got, want) {
		t.Fatalf("completed record without a Keep has fields %v; want %v", got, want)
	}

	kept, tok2 := storetest.Key(), storetest.Token()
	if _, ok, err := s.AcquireKeep(ctx, kept, tok2, "fp", time.Minute, idem.Keep{Uncertain: time.Hour, Tombstone: 2 * time.Hour}); err != nil || !ok {
		t.Fatalf("AcquireKeep = %v, %v", ok, err)
	}
	raw := rawRecord(t, coll, kept)
	until, exp := raw.Lookup("until").Time(), raw.Lookup("expiresAt").Time()
	if d := exp.Sub(until); d != time.Hour || raw.Lookup("keepU").Int64() != 3600000 || raw.Lookup("keepT").Int64() != 7200000 {
		t.Fatalf("in-progress record under a Keep = %v; want expiresAt = until + 1h, the keep in ms", raw)
	}
	if err := s.Complete(ctx, kept, tok2, []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	raw = rawRecord(t, coll, kept)
	if d := raw.Lookup("expiresAt").Time().Sub(raw.Lookup("until").Time()); d != 2*time.Hour {
		t.Fatalf("completed record under a Keep = %v; want expiresAt = until + 2h", raw)
	}

	// A record written by the previous version (no gen, no keep fields) is
	// read and completed as before.
	old, tok3 := storetest.Key(), storetest.Token()
	if _, err := coll.InsertOne(ctx, bson.D{
		{Key: "_id", Value: old}, {Key: "state", Value: int32(1)}, {Key: "token", Value: tok3},
		{Key: "fingerprint", Value: "fp"}, {Key: "expiresAt", Value: bson.NewDateTimeFromTime(time.Now().Add(time.Minute))},
	}); err != nil {
		t.Fatal(err)
	}
	if rec, ok, err := s.AcquireKeep(ctx, old, storetest.Token(), "fp", time.Minute, idem.Keep{Uncertain: time.Hour}); err != nil || ok || rec.State != idem.StateInProgress || rec.Token != tok3 {
		t.Fatalf("AcquireKeep of an old in-progress record = %+v, %v, %v; want it in progress", rec, ok, err)
	}
	if err := s.Complete(ctx, old, tok3, []byte("r"), time.Hour); err != nil {
		t.Fatalf("Complete of an old record by its owner: %v", err)
	}
	if rec, _, err := s.Get(ctx, old); err != nil || rec.State != idem.StateCompleted {
		t.Fatalf("old record after Complete = %+v, %v", rec, err)
	}
}

// TestKeepAcrossStores checks that a record carries its Keep to a Store
// that did not acquire it (another instance, configured differently): its
// Extend and Complete follow the stored keep.
func TestKeepAcrossStores(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	a, b := mongostore.New(coll), mongostore.New(coll)
	ctx := ctxT(t)
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := a.AcquireKeep(ctx, key, tok, "fp", time.Minute, idem.Keep{Uncertain: time.Hour, Tombstone: 2 * time.Hour}); err != nil || !ok {
		t.Fatalf("AcquireKeep = %v, %v", ok, err)
	}
	if err := b.Extend(ctx, key, tok, 300*time.Millisecond); err != nil {
		t.Fatalf("Extend through another Store: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	if rec, ok, err := b.Acquire(ctx, key, storetest.Token(), "fp", time.Minute); err != nil || ok || rec.State != idem.StateUncertain {
		t.Fatalf("Acquire after the extended lease lapsed = %+v, %v, %v; want uncertain", rec, ok, err)
	}
	if err := b.Complete(ctx, key, tok, []byte("r"), 100*time.Millisecond); err != nil {
		t.Fatalf("Complete through another Store: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	if rec, ok, err := a.Acquire(ctx, key, storetest.Token(), "fp", time.Minute); err != nil || ok || rec.State != idem.StateExpired {
		t.Fatalf("Acquire after the retention = %+v, %v, %v; want a tombstone", rec, ok, err)
	}
	if err := b.Complete(ctx, storetest.Key(), tok, []byte("r"), time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Complete of an absent key = %v; want ErrNotOwner", err)
	}
}

// TestTombstoneFreed checks that a tombstone's response is freed when its
// retention ends: by the first Acquire (or Get) that finds it, and by
// Purge, which keeps the tombstone itself until its keep ends.
func TestTombstoneFreed(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	body := bytes.Repeat([]byte("b"), 200)
	for _, read := range []string{"Acquire", "Get"} {
		key := tombstone(t, s, body, time.Hour)
		if raw := rawRecord(t, coll, key); raw.Lookup("response").Type != bson.TypeBinary {
			t.Fatalf("tombstone freed before any read: %v", raw)
		}
		var rec idem.Record
		var err error
		if read == "Acquire" {
			rec, _, err = s.Acquire(ctx, key, storetest.Token(), "fp", time.Minute)
		} else {
			rec, _, err = s.Get(ctx, key)
		}
		if err != nil || rec.State != idem.StateExpired || rec.Response != nil {
			t.Fatalf("%s of a tombstone = %+v, %v", read, rec, err)
		}
		if _, err := rawRecord(t, coll, key).LookupErr("response"); err == nil {
			t.Fatalf("%s of a tombstone left its response stored", read)
		}
	}

	purged := []string{tombstone(t, s, body, time.Hour), tombstone(t, s, body, time.Hour)}
	liveKey, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.AcquireKeep(ctx, liveKey, tok, "fp", time.Minute, idem.Keep{Tombstone: time.Hour}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := s.Complete(ctx, liveKey, tok, body, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Purge(ctx); err != nil || n != 0 {
		t.Fatalf("Purge = %d, %v; want nothing deleted", n, err)
	}
	for _, key := range purged {
		raw := rawRecord(t, coll, key)
		if _, err := raw.LookupErr("response"); err == nil {
			t.Fatalf("Purge left a tombstone's response stored: %v", raw)
		}
	}
	if _, err := rawRecord(t, coll, liveKey).LookupErr("response"); err != nil {
		t.Fatal("Purge freed the response of a record within its retention")
	}

	// The tombstone's keep ends: Purge deletes it.
	short := tombstone(t, s, body, 200*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	if n, err := s.Purge(ctx); err != nil || n != 1 {
		t.Fatalf("Purge after the keep = %d, %v; want the tombstone deleted", n, err)
	}
	if n, _ := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: short}}); n != 0 {
		t.Fatal("tombstone still stored after its keep and a Purge")
	}
}

// TestKeepCost measures the stored bytes (Object.bsonsize) of a record
// completed with a 200-byte body, of its tombstone, and of an uncertain
// record, as the README reports them.
func TestKeepCost(t *testing.T) {
	c, ferret := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	e, err := idem.New(s, idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	x, resp := e.Begin(ctx, payment("k1", `{"amount":1}`))
	if x == nil {
		t.Fatalf("not executed: %+v", resp)
	}
	_, _ = x.Write(bytes.Repeat([]byte("b"), 200))
	x.Finish(http.StatusCreated, http.Header{"Content-Type": {"application/json"}})
	var completed bson.Raw
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil || !cur.Next(ctx) {
		t.Fatalf("find the completed record: %v", err)
	}
	completed = slices.Clone(cur.Current)
	_ = cur.Close(ctx)
	_, response := completed.Lookup("response").Binary()

	fp := completed.Lookup("fingerprint").StringValue()
	key := tombstoneFP(t, s, fp, response, time.Hour)
	withResponse := len(rawRecord(t, coll, key))
	if _, _, err := s.Acquire(ctx, key, storetest.Token(), "fp", time.Minute); err != nil {
		t.Fatal(err)
	}
	freed := len(rawRecord(t, coll, key))
	unc := storetest.Key()
	if _, ok, err := s.AcquireKeep(ctx, unc, storetest.Token(), fp, 100*time.Millisecond, idem.Keep{Uncertain: time.Hour}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	uncertain := len(rawRecord(t, coll, unc))
	t.Logf("server: FerretDB=%v; Object.bsonsize: completed, 200-byte body (%d-byte encoded response): %d B; "+
		"its tombstone within retention: %d B; tombstone after retention (response freed): %d B; uncertain record: %d B",
		ferret, len(response), len(completed), withResponse, freed, uncertain)
	// The tombstone is the completed record without its response, plus
	// until and keepT (25 B) and the longer generation of this store's
	// records.
	if freed > len(completed)-len(response)+64 {
		t.Errorf("tombstone of %d B: more than the completed record (%d B) without its response (%d B) and 64 B", freed, len(completed), len(response))
	}
}

// TestKeepRoundTrips counts the commands of the Keeper paths with the
// driver's command monitor.
func TestKeepRoundTrips(t *testing.T) {
	var mu sync.Mutex
	var cmds []string
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		mu.Lock()
		cmds = append(cmds, e.CommandName)
		mu.Unlock()
	}}
	cl := connect(t, options.Client().SetMonitor(mon))
	coll := cl.Database(testDB).Collection(randomName("rt_"))
	t.Cleanup(func() { drop(coll) })
	measure := func(f func()) []string {
		mu.Lock()
		cmds = nil
		mu.Unlock()
		f()
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(cmds)
	}
	expect := func(what string, got []string, want ...string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s sent %d commands %v; want %d %v", what, len(got), got, len(want), want)
		} else {
			t.Logf("%s: %d round trip(s) %v", what, len(got), got)
		}
	}
	s := mongostore.New(coll, mongostore.WithClockRefresh(time.Hour))
	other := mongostore.New(coll, mongostore.WithClockRefresh(time.Hour))
	ctx := ctxT(t)
	_, _, _ = s.Get(ctx, "warm-up")
	_, _, _ = other.Get(ctx, "warm-up")
	keep := idem.Keep{Uncertain: time.Hour, Tombstone: time.Hour}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	k1, tok := storetest.Key(), storetest.Token()
	expect("AcquireKeep of a free key", measure(func() { _, _, _ = s.AcquireKeep(ctx, k1, tok, "fp", time.Minute, keep) }), "findAndModify")
	expect("Extend by the acquiring Store", measure(func() { must(s.Extend(ctx, k1, tok, time.Minute)) }), "update")
	expect("Extend by another Store", measure(func() { must(other.Extend(ctx, k1, tok, time.Minute)) }), "update", "find", "update")
	expect("Complete by the acquiring Store", measure(func() { must(s.Complete(ctx, k1, tok, []byte("r"), time.Hour)) }), "update")

	k2, tok2 := storetest.Key(), storetest.Token()
	_, _, _ = s.AcquireKeep(ctx, k2, tok2, "fp", 100*time.Millisecond, keep)
	expect("Complete by another Store", measure(func() { must(other.Complete(ctx, k2, tok2, []byte("r"), 100*time.Millisecond)) }), "update", "find", "update")
	time.Sleep(300 * time.Millisecond)
	expect("first Acquire of a tombstone (frees its response)", measure(func() { _, _, _ = s.Acquire(ctx, k2, storetest.Token(), "fp", time.Minute) }), "findAndModify", "update")
	expect("Acquire of a freed tombstone", measure(func() { _, _, _ = s.Acquire(ctx, k2, storetest.Token(), "fp", time.Minute) }), "findAndModify")

	k3, k4 := storetest.Key(), storetest.Key()
	_, _, _ = s.AcquireKeep(ctx, k3, storetest.Token(), "fp", 100*time.Millisecond, keep)
	_, _, _ = s.AcquireKeep(ctx, k4, storetest.Token(), "fp", 100*time.Millisecond, keep)
	time.Sleep(300 * time.Millisecond)
	expect("Acquire of an uncertain record", measure(func() { _, _, _ = s.Acquire(ctx, k3, storetest.Token(), "fp", time.Minute) }), "findAndModify")
	expect("Resolve (release)", measure(func() { must(s.Resolve(ctx, k3, nil, 0)) }), "delete")
	expect("Resolve (complete)", measure(func() { must(s.Resolve(ctx, k4, []byte("r"), time.Hour)) }), "find", "update")
}

// TestEnsureIndexesUpgrade runs EnsureIndexes on a collection indexed by
// the previous version (the expiresAt index only): it adds the sparse
// until and dueAt indexes, and running it again changes nothing.
func TestEnsureIndexesUpgrade(t *testing.T) {
	c, ferret := shared(t)
	coll := collection(t, c)
	ctx := ctxT(t)
	old := options.Index().SetName("idem_expiresAt_ttl").SetExpireAfterSeconds(0)
	if ferret {
		old = options.Index().SetName("idem_expiresAt")
	}
	if _, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "expiresAt", Value: 1}}, Options: old}); err != nil {
		t.Fatal(err)
	}
	s := mongostore.New(coll, mongostore.WithLogger(quiet))
	for i := range 2 {
		if err := s.EnsureIndexes(ctx); err != nil {
			t.Fatalf("EnsureIndexes #%d on the old indexes: %v", i+1, err)
		}
	}
	cur, err := coll.Indexes().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var idx []bson.M
	if err := cur.All(ctx, &idx); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ix := range idx {
		names = append(names, ix["name"].(string))
	}
	slices.Sort(names)
	if got := strings.Join(names, ","); !strings.Contains(got, "idem_until") || !strings.Contains(got, "idem_due") || len(names) != 4 {
		t.Fatalf("indexes after the upgrade = %s; want _id, expiresAt, idem_due and idem_until", got)
	}
}
