package mongostore_test

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mongostore"
)

// Claims are documents with _id "<key>~<token of the version they end>"
// (README, "How it works"); these tests write them by hand to stand for a
// request that claimed a version and then stalled or died.

const (
	claimTakeover = int32(3)
	claimDeleting = int32(4)
)

func insertClaim(t *testing.T, coll *mongo.Collection, key, ended string, state int32, token, fp string, lease time.Time) {
	t.Helper()
	if _, err := coll.InsertOne(ctxT(t), bson.D{
		{Key: "_id", Value: key + "~" + ended}, {Key: "state", Value: state}, {Key: "token", Value: token},
		{Key: "fingerprint", Value: fp}, {Key: "lease", Value: bson.NewDateTimeFromTime(lease)},
		{Key: "expiresAt", Value: bson.NewDateTimeFromTime(time.Now().Add(time.Hour))},
	}); err != nil {
		t.Fatal(err)
	}
}

// lapsed returns a key whose in-progress record, held by the returned
// token, has lapsed (and is still stored).
func lapsed(t *testing.T, s *mongostore.Store) (key, owner string) {
	t.Helper()
	key, owner = storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctxT(t), key, owner, "fp-a", 100*time.Millisecond); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	time.Sleep(300 * time.Millisecond)
	return key, owner
}

func recordToken(t *testing.T, coll *mongo.Collection, key string) string {
	t.Helper()
	var d struct {
		Token string `bson:"token"`
	}
	if err := coll.FindOne(ctxT(t), bson.D{{Key: "_id", Value: key}}).Decode(&d); err != nil {
		t.Fatalf("record %s: %v", key[:8], err)
	}
	return d.Token
}

// TestClaimFollowed: a takeover that claimed a version but never rewrote
// the record (it died, or is slow) is answered from its claim while the
// lease it granted itself runs (409, its fingerprint), and taken over in
// turn, by a claim on its own version, once that lease lapsed.
func TestClaimFollowed(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)

	key, owner := lapsed(t, s)
	insertClaim(t, coll, key, owner, claimTakeover, "stalled", "fp-x", time.Now().Add(time.Hour))
	rec, ok, err := s.Acquire(ctx, key, storetest.Token(), "fp-b", time.Minute)
	if err != nil || ok || rec.State != idem.StateInProgress || rec.Token != "stalled" || rec.Fingerprint != "fp-x" {
		t.Fatalf("Acquire while the stalled takeover's lease runs = %+v, %v, %v; want its in-progress record", rec, ok, err)
	}
	if got := recordToken(t, coll, key); got != owner {
		t.Fatalf("record rewritten to %q by a losing Acquire", got)
	}

	key, owner = lapsed(t, s)
	insertClaim(t, coll, key, owner, claimTakeover, "dead", "fp-x", time.Now().Add(-time.Minute))
	tok := storetest.Token()
	if rec, ok, err := s.Acquire(ctx, key, tok, "fp-b", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire after the dead takeover's lease = %+v, %v, %v; want acquired", rec, ok, err)
	}
	if got := recordToken(t, coll, key); got != tok {
		t.Fatalf("record token %q after the takeover; want %q", got, tok)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: key + "~dead"}}); err != nil || n != 1 {
		t.Fatalf("claims on the dead takeover's version = %d, %v; want 1", n, err)
	}
	if err := s.Complete(ctx, key, tok, &idem.Response{Status: 201}, time.Hour); err != nil {
		t.Fatalf("Complete by the new owner: %v", err)
	}
}

// TestDeletingClaim: a record being released or purged (its version
// claimed for deletion) is not taken over while the deletion's lease runs,
// and is taken over after it when the deleter died.
func TestDeletingClaim(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)

	key, owner := lapsed(t, s)
	insertClaim(t, coll, key, owner, claimDeleting, "deleter", "", time.Now().Add(time.Hour))
	if _, _, err := s.Acquire(ctx, key, storetest.Token(), "fp-b", time.Minute); !errors.Is(err, mongostore.ErrContention) {
		t.Fatalf("Acquire while the record is being deleted = %v; want ErrContention", err)
	}
	if got := recordToken(t, coll, key); got != owner {
		t.Fatalf("record rewritten to %q during its deletion", got)
	}

	key, owner = lapsed(t, s)
	insertClaim(t, coll, key, owner, claimDeleting, "dead-deleter", "", time.Now().Add(-time.Minute))
	if _, ok, err := s.Acquire(ctx, key, storetest.Token(), "fp-b", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire after the dead deleter's lease = %v, %v; want acquired", ok, err)
	}
}

// TestReleaseFencedByClaim: once a takeover claimed the owner's version,
// the owner's Release refuses, even before the record is rewritten, so a
// release can never delete the record of the request that took over.
func TestReleaseFencedByClaim(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	key, owner := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, owner, "fp-a", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	insertClaim(t, coll, key, owner, claimTakeover, "successor", "fp-a", time.Now().Add(time.Hour))
	if err := s.Release(ctx, key, owner); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Release after a takeover claimed the version = %v; want ErrNotOwner", err)
	}
	if got := recordToken(t, coll, key); got != owner {
		t.Fatalf("record token %q; want the record left alone", got)
	}

	// A Release by a token that holds nothing withdraws its claim.
	other := storetest.Token()
	if err := s.Release(ctx, key, other); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Release by another token = %v; want ErrNotOwner", err)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: key + "~" + other}}); err != nil || n != 0 {
		t.Fatalf("claims left by a refused Release = %d, %v; want 0", n, err)
	}
}

// TestPurgeSkipsClaimed: Purge never deletes an expired record whose
// version a takeover claimed: the takeover is about to rewrite it.
func TestPurgeSkipsClaimed(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	claimed, owner := lapsed(t, s)
	free, _ := lapsed(t, s)
	insertClaim(t, coll, claimed, owner, claimTakeover, "successor", "fp-b", time.Now().Add(time.Hour))
	if n, err := s.Purge(ctx); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want 1 (the unclaimed record)", n, err)
	}
	if got := recordToken(t, coll, claimed); got != owner {
		t.Fatalf("claimed record token %q after Purge; want it kept", got)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: free}}); err != nil || n != 0 {
		t.Fatalf("unclaimed expired record left = %d, %v", n, err)
	}
}

// TestStaleOwnerWrite shows what remains possible on a server whose
// conditional updates are not atomic (FerretDB reads the matching document,
// then replaces it by _id): an owner's Complete that read its record just
// before its lease lapsed and writes it just after another request took the
// key over replaces the new owner's record. The write is reproduced here
// as the replace FerretDB performs. What it cannot do: make a third
// request execute. The new owner's Complete is refused (its handler ran:
// two executions, as any lapsed lease allows), and every later duplicate
// replays the stale owner's response.
func TestStaleOwnerWrite(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	key, owner := lapsed(t, s)
	var stale bson.D
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&stale); err != nil {
		t.Fatal(err)
	}
	successor := storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, successor, "fp-a", time.Minute); err != nil || !ok {
		t.Fatalf("takeover = %v, %v", ok, err)
	}
	resp := &idem.Response{Status: 201, Body: []byte(`{"id":"stale"}`)}
	enc, err := resp.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range stale { // the stale owner's Complete, computed from what it read
		switch stale[i].Key {
		case "state":
			stale[i].Value = int32(2)
		case "expiresAt":
			stale[i].Value = bson.NewDateTimeFromTime(time.Now().Add(time.Hour))
		}
	}
	stale = append(stale, bson.E{Key: "response", Value: enc})
	if _, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: key}}, stale); err != nil {
		t.Fatal(err)
	}

	if err := s.Complete(ctx, key, successor, &idem.Response{Status: 201}, time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("successor's Complete over the stale write = %v; want ErrNotOwner", err)
	}
	for range 3 {
		rec, ok, err := s.Acquire(ctx, key, storetest.Token(), "fp-a", time.Minute)
		if err != nil || ok || rec.State != idem.StateCompleted || string(rec.Response.Body) != `{"id":"stale"}` {
			t.Fatalf("duplicate after the stale write = %+v, %v, %v; want the stale owner's response replayed", rec, ok, err)
		}
	}
	if got := recordToken(t, coll, key); got != owner {
		t.Fatalf("record token %q", got)
	}
}
