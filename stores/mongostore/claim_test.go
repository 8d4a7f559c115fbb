package mongostore_test

import (
	"context"
	"errors"
	"sync/atomic"
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

// Claims are documents with _id "<key>~<generation of the version they end>"
// (README, "How it works"); these tests write them by hand to stand for a
// request that claimed a version and then stalled or died.

const (
	claimTakeover = int32(3)
	claimDeleting = int32(4)
)

// insertClaim ends the version ended (a generation) of key, granting it to
// token with generation gen until lease.
func insertClaim(t *testing.T, coll *mongo.Collection, key, ended string, state int32, token, gen, fp string, lease time.Time) {
	t.Helper()
	if _, err := coll.InsertOne(ctxT(t), bson.D{
		{Key: "_id", Value: key + "~" + ended}, {Key: "state", Value: state}, {Key: "token", Value: token}, {Key: "gen", Value: gen},
		{Key: "fingerprint", Value: fp}, {Key: "lease", Value: bson.NewDateTimeFromTime(lease)},
		{Key: "expiresAt", Value: bson.NewDateTimeFromTime(time.Now().Add(time.Hour))},
	}); err != nil {
		t.Fatal(err)
	}
}

// lapsed returns a key whose in-progress record, held by owner, has lapsed
// (and is still stored), and the record's generation.
func lapsed(t *testing.T, s *mongostore.Store, coll *mongo.Collection) (key, owner, gen string) {
	t.Helper()
	key, owner = storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctxT(t), key, owner, "fp-a", 100*time.Millisecond); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	time.Sleep(300 * time.Millisecond)
	_, gen = recordOwner(t, coll, key)
	return key, owner, gen
}

// recordOwner returns the token and generation of key's record.
func recordOwner(t *testing.T, coll *mongo.Collection, key string) (token, gen string) {
	t.Helper()
	var d struct {
		Token string `bson:"token"`
		Gen   string `bson:"gen"`
	}
	if err := coll.FindOne(ctxT(t), bson.D{{Key: "_id", Value: key}}).Decode(&d); err != nil {
		t.Fatalf("record %s: %v", key[:8], err)
	}
	if d.Gen == "" {
		t.Fatalf("record %s has no generation", key[:8])
	}
	return d.Token, d.Gen
}

func recordToken(t *testing.T, coll *mongo.Collection, key string) string {
	t.Helper()
	tok, _ := recordOwner(t, coll, key)
	return tok
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

	key, owner, gen := lapsed(t, s, coll)
	insertClaim(t, coll, key, gen, claimTakeover, "stalled", "stalled-gen", "fp-x", time.Now().Add(time.Hour))
	rec, ok, err := s.Acquire(ctx, key, storetest.Token(), "fp-b", time.Minute)
	if err != nil || ok || rec.State != idem.StateInProgress || rec.Token != "stalled" || rec.Fingerprint != "fp-x" {
		t.Fatalf("Acquire while the stalled takeover's lease runs = %+v, %v, %v; want its in-progress record", rec, ok, err)
	}
	if got := recordToken(t, coll, key); got != owner {
		t.Fatalf("record rewritten to %q by a losing Acquire", got)
	}

	key, _, gen = lapsed(t, s, coll)
	insertClaim(t, coll, key, gen, claimTakeover, "dead", "dead-gen", "fp-x", time.Now().Add(-time.Minute))
	tok := storetest.Token()
	if rec, ok, err := s.Acquire(ctx, key, tok, "fp-b", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire after the dead takeover's lease = %+v, %v, %v; want acquired", rec, ok, err)
	}
	if got := recordToken(t, coll, key); got != tok {
		t.Fatalf("record token %q after the takeover; want %q", got, tok)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: key + "~dead-gen"}}); err != nil || n != 1 {
		t.Fatalf("claims on the dead takeover's version = %d, %v; want 1", n, err)
	}
	if err := s.Complete(ctx, key, tok, []byte("response"), time.Hour); err != nil {
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

	key, owner, gen := lapsed(t, s, coll)
	insertClaim(t, coll, key, gen, claimDeleting, "", "deleter-gen", "", time.Now().Add(time.Hour))
	if _, _, err := s.Acquire(ctx, key, storetest.Token(), "fp-b", time.Minute); !errors.Is(err, mongostore.ErrContention) {
		t.Fatalf("Acquire while the record is being deleted = %v; want ErrContention", err)
	}
	if got := recordToken(t, coll, key); got != owner {
		t.Fatalf("record rewritten to %q during its deletion", got)
	}

	key, _, gen = lapsed(t, s, coll)
	insertClaim(t, coll, key, gen, claimDeleting, "", "dead-deleter-gen", "", time.Now().Add(-time.Minute))
	if _, ok, err := s.Acquire(ctx, key, storetest.Token(), "fp-b", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire after the dead deleter's lease = %v, %v; want acquired", ok, err)
	}
}

// TestReleaseCutOff: a Release cut off between its claim and its delete
// (its instance died: the soak under `make test` SIGKILLs instances) keeps
// the key from being taken over until the owner's lease lapsed or the
// deletion's least lease passed, whichever is later, and no longer. The
// claim used to last a minute past the release, and a client retrying that
// key got 503 for a minute.
func TestReleaseCutOff(t *testing.T) {
	var cut atomic.Pointer[context.CancelFunc]
	mon := &event.CommandMonitor{Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) {
		if f := cut.Load(); f != nil && e.CommandName == "insert" {
			(*f)() // the claim is in; the delete never starts
		}
	}}
	coll := collection(t, connect(t, options.Client().SetMonitor(mon)))
	releaseCutOff := func(s *mongostore.Store, key, owner string) {
		t.Helper()
		ctx, cancel := context.WithCancel(ctxT(t))
		defer cancel()
		cut.Store(&cancel)
		defer cut.Store(nil)
		if err := s.Release(ctx, key, owner); !errors.Is(err, context.Canceled) {
			t.Fatalf("Release cut off after its claim = %v; want context.Canceled", err)
		}
		if got := recordToken(t, coll, key); got != owner {
			t.Fatalf("record token %q after the cut-off Release; want the owner's record left", got)
		}
	}

	// The owner's lease outlasts the deletion's: the claim lasts as long.
	s := mongostore.New(coll)
	key, owner := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctxT(t), key, owner, "fp-a", time.Hour); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	_, gen := recordOwner(t, coll, key)
	releaseCutOff(s, key, owner)
	var rec, cl struct {
		ExpiresAt bson.DateTime `bson:"expiresAt"`
		Lease     bson.DateTime `bson:"lease"`
		State     int32         `bson:"state"`
	}
	if err := coll.FindOne(ctxT(t), bson.D{{Key: "_id", Value: key}}).Decode(&rec); err != nil {
		t.Fatal(err)
	}
	if err := coll.FindOne(ctxT(t), bson.D{{Key: "_id", Value: key + "~" + gen}}).Decode(&cl); err != nil {
		t.Fatalf("claim of the cut-off Release: %v", err)
	}
	if cl.State != claimDeleting || cl.Lease != rec.ExpiresAt {
		t.Fatalf("claim state %d lease %v; want %d and the owner's lease end %v", cl.State, cl.Lease.Time(), claimDeleting, rec.ExpiresAt.Time())
	}

	// The deletion's least lease is short: the key is taken over once the
	// owner's lease lapsed.
	s = mongostore.New(coll, mongostore.WithDeleteLease(100*time.Millisecond))
	key, owner = storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctxT(t), key, owner, "fp-a", time.Second); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	releaseCutOff(s, key, owner)
	tok := storetest.Token()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		_, ok, err := s.Acquire(ctxT(t), key, tok, "fp-b", time.Minute)
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key still not taken over 2 minutes after the owner's 1s lease (last answer %v)", err)
		}
		if err != nil && !errors.Is(err, mongostore.ErrContention) {
			t.Fatalf("Acquire: %v", err)
		}
	}
	if got := recordToken(t, coll, key); got != tok {
		t.Fatalf("record token %q after the takeover; want %q", got, tok)
	}

	// A record kept past its lease for its journal: the claim lasts the
	// owner's lease, not the retention the journal is kept for, so the
	// journal is resumed once that lease lapsed (the claim used to last
	// the retention, and the key stayed blocked for it).
	key, owner = storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctxT(t), key, owner, "fp-a", time.Second); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if _, err := s.StartStep(ctxT(t), key, owner, "charge", time.Hour); err != nil {
		t.Fatalf("StartStep: %v", err)
	}
	_, gen = recordOwner(t, coll, key)
	releaseCutOff(s, key, owner)
	if err := coll.FindOne(ctxT(t), bson.D{{Key: "_id", Value: key}}).Decode(&rec); err != nil {
		t.Fatal(err)
	}
	if err := coll.FindOne(ctxT(t), bson.D{{Key: "_id", Value: key + "~" + gen}}).Decode(&cl); err != nil {
		t.Fatalf("claim of the cut-off Release: %v", err)
	}
	if cl.Lease >= rec.ExpiresAt {
		t.Fatalf("claim lease %v; want the owner's lease end, before the journal's retention end %v", cl.Lease.Time(), rec.ExpiresAt.Time())
	}
	tok = storetest.Token()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		rec, ok, err := s.Acquire(ctxT(t), key, tok, "fp-a", time.Minute)
		if ok {
			if rec.Token != owner {
				t.Fatalf("takeover of the journaled record reports holder %q; want %q", rec.Token, owner)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("journaled key still not taken over 2 minutes after the owner's 1s lease (last answer %v): the cut-off Release's claim outlives the lease", err)
		}
		if err != nil && !errors.Is(err, mongostore.ErrContention) {
			t.Fatalf("Acquire: %v", err)
		}
	}
	if st, err := s.Steps(ctxT(t), key); err != nil || len(st) != 1 || st[0].Name != "charge" || st[0].Token != owner {
		t.Fatalf("Steps after the takeover = %+v, %v; want the owner's charge resumed", st, err)
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
	_, gen := recordOwner(t, coll, key)
	insertClaim(t, coll, key, gen, claimTakeover, "successor", "successor-gen", "fp-a", time.Now().Add(time.Hour))
	if err := s.Release(ctx, key, owner); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("Release after a takeover claimed the version = %v; want ErrNotOwner", err)
	}
	if got := recordToken(t, coll, key); got != owner {
		t.Fatalf("record token %q; want the record left alone", got)
	}

	// The owner's Release, when nothing was claimed, claims and deletes.
	key2, owner2 := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, key2, owner2, "fp-a", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	_, gen2 := recordOwner(t, coll, key2)
	if err := s.Release(ctx, key2, owner2); err != nil {
		t.Fatalf("owner's Release: %v", err)
	}
	var c2 bson.M
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: key2 + "~" + gen2}}).Decode(&c2); err != nil || c2["state"] != claimDeleting {
		t.Fatalf("claim left by the owner's Release = %v, %v; want a deleting claim", c2, err)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: key2}}); err != nil || n != 0 {
		t.Fatalf("records left after the owner's Release = %d, %v", n, err)
	}
}

// TestPurgeSkipsClaimed: Purge never deletes an expired record whose
// version a takeover claimed (the takeover is about to rewrite it), and
// deletes claims past their own expiry.
func TestPurgeSkipsClaimed(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	claimed, owner, gen := lapsed(t, s, coll)
	free, _, _ := lapsed(t, s, coll)
	insertClaim(t, coll, claimed, gen, claimTakeover, "successor", "successor-gen", "fp-b", time.Now().Add(time.Hour))
	old := storetest.Key() + "~old-gen" // a claim past its own expiry: Purge deletes it
	if _, err := coll.InsertOne(ctx, bson.D{
		{Key: "_id", Value: old}, {Key: "state", Value: claimTakeover}, {Key: "token", Value: "t"}, {Key: "gen", Value: "g"},
		{Key: "lease", Value: bson.NewDateTimeFromTime(time.Now().Add(-2 * time.Minute))},
		{Key: "expiresAt", Value: bson.NewDateTimeFromTime(time.Now().Add(-time.Minute))},
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Purge(ctx); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want 1 (the unclaimed record)", n, err)
	}
	if got := recordToken(t, coll, claimed); got != owner {
		t.Fatalf("claimed record token %q after Purge; want it kept", got)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: free}}); err != nil || n != 0 {
		t.Fatalf("unclaimed expired record left = %d, %v", n, err)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: old}}); err != nil || n != 0 {
		t.Fatalf("expired claims left = %d, %v; want 0", n, err)
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
	key, owner, _ := lapsed(t, s, coll)
	var stale bson.D
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&stale); err != nil {
		t.Fatal(err)
	}
	successor := storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, successor, "fp-a", time.Minute); err != nil || !ok {
		t.Fatalf("takeover = %v, %v", ok, err)
	}
	enc := []byte(`{"id":"stale"}`)
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

	if err := s.Complete(ctx, key, successor, []byte("response"), time.Hour); !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("successor's Complete over the stale write = %v; want ErrNotOwner", err)
	}
	for range 3 {
		rec, ok, err := s.Acquire(ctx, key, storetest.Token(), "fp-a", time.Minute)
		if err != nil || ok || rec.State != idem.StateCompleted || string(rec.Response) != `{"id":"stale"}` {
			t.Fatalf("duplicate after the stale write = %+v, %v, %v; want the stale owner's response replayed", rec, ok, err)
		}
	}
	if got := recordToken(t, coll, key); got != owner {
		t.Fatalf("record token %q", got)
	}
}

// TestRecordWithoutGeneration: records written before generations existed
// are claimed by their token, taken over and released like the others.
func TestRecordWithoutGeneration(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	insert := func(key, token string, expires time.Time) {
		if _, err := coll.InsertOne(ctx, bson.D{
			{Key: "_id", Value: key}, {Key: "state", Value: int32(1)}, {Key: "token", Value: token},
			{Key: "fingerprint", Value: "fp-a"}, {Key: "expiresAt", Value: bson.NewDateTimeFromTime(expires)},
		}); err != nil {
			t.Fatal(err)
		}
	}
	expired, live := storetest.Key(), storetest.Key()
	insert(expired, "old-owner", time.Now().Add(-time.Minute))
	insert(live, "live-owner", time.Now().Add(time.Hour))

	tok := storetest.Token()
	if _, ok, err := s.Acquire(ctx, expired, tok, "fp-b", time.Minute); err != nil || !ok {
		t.Fatalf("takeover of an expired record without generation = %v, %v", ok, err)
	}
	if got, _ := recordOwner(t, coll, expired); got != tok {
		t.Fatalf("record token %q after the takeover; want %q", got, tok)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: expired + "~old-owner"}}); err != nil || n != 1 {
		t.Fatalf("claims on the token-named version = %d, %v; want 1", n, err)
	}
	if err := s.Release(ctx, live, "live-owner"); err != nil {
		t.Fatalf("Release of a live record without generation: %v", err)
	}
	if _, found, err := s.Get(ctx, live); err != nil || found {
		t.Fatalf("Get after the release = %v, %v; want absent", found, err)
	}
}

// TestRenewalRacingCompletion: the engine keeps renewing a lease while it
// completes the record. On a server whose updates read and then replace by
// _id (FerretDB), a renewal reading the in-progress record before the
// completion and writing after it would put the record back in progress,
// and a retry would execute again once that lease lapsed. The store runs
// one owner's Complete, Extend and Release one at a time.
func TestRenewalRacingCompletion(t *testing.T) {
	c, _ := shared(t)
	s := mongostore.New(collection(t, c))
	ctx := ctxT(t)
	for i := range 40 {
		key, tok := storetest.Key(), storetest.Token()
		if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
			t.Fatalf("Acquire = %v, %v", ok, err)
		}
		start := make(chan struct{})
		done := make(chan error, 4)
		for range 3 {
			go func() {
				<-start
				err := s.Extend(ctx, key, tok, time.Minute)
				if errors.Is(err, idem.ErrNotOwner) { // completed first
					err = nil
				}
				done <- err
			}()
		}
		go func() {
			<-start
			done <- s.Complete(ctx, key, tok, []byte("response"), time.Hour)
		}()
		close(start)
		for range 4 {
			if err := <-done; err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
		if rec, found, err := s.Get(ctx, key); err != nil || !found || rec.State != idem.StateCompleted {
			t.Fatalf("round %d: record after a completion racing renewals = %+v, %v, %v; want completed", i, rec, found, err)
		}
	}
}

// TestRecoveryClaimCutOff: a recovery Claim cut off between the insert of
// its claim and the rewrite of the record (its call timed out on a loaded
// server after the insert applied, so its withdrawal failed too) keeps
// other recovery claims off only while the lease it granted itself runs:
// the next Claim after that takes the record over by a claim on the dead
// claim's version, as Acquire does. It used to find the claim taken and
// answer not claimed at every pass, so the record stayed in progress for
// as long as the claim document lived (for good on a server without TTL
// indexes, FerretDB). A claim whose lease runs (a takeover's or a
// Release's) keeps it off; one whose lease passed does not.
func TestRecoveryClaimCutOff(t *testing.T) {
	var cut atomic.Pointer[context.CancelFunc]
	mon := &event.CommandMonitor{Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) {
		if f := cut.Load(); f != nil && e.CommandName == "insert" {
			(*f)() // the claim is in; the rewrite never starts
		}
	}}
	coll := collection(t, connect(t, options.Client().SetMonitor(mon)))
	s := mongostore.New(coll)
	ctx := ctxT(t)
	payload := []byte("payload")
	// A claim takes the lease kept with the payload: 2s, so that the
	// cut-off claim's lease passes below, and the claim after it is
	// extended at once.
	const claimLease = 2 * time.Second
	due := func(t *testing.T) (key, owner, gen string) {
		t.Helper()
		key, owner = storetest.Key(), storetest.Token()
		if _, ok, err := s.Acquire(ctx, key, owner, "fp-a", time.Minute); err != nil || !ok {
			t.Fatalf("Acquire = %v, %v", ok, err)
		}
		if err := s.SetRecovery(ctx, key, owner, payload, time.Hour, claimLease); err != nil {
			t.Fatalf("SetRecovery: %v", err)
		}
		if err := s.Extend(ctx, key, owner, time.Millisecond); err != nil { // the holder stops: its lease lapses now
			t.Fatalf("Extend: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
		_, gen = recordOwner(t, coll, key)
		return key, owner, gen
	}
	claimed := func(t *testing.T, key string) (string, bool) {
		t.Helper()
		tok := storetest.Token()
		c, ok, err := s.Claim(ctx, key, tok, time.Minute, 0)
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		if ok && (string(c.Payload) != string(payload) || c.Fingerprint != "fp-a") {
			t.Fatalf("Claim = %+v; want the record's payload and fingerprint", c)
		}
		if ok {
			if err := s.Extend(ctx, key, tok, time.Minute); err != nil {
				t.Fatalf("Extend of the claim's lease: %v", err)
			}
		}
		return tok, ok
	}

	key, owner, _ := due(t)
	cctx, cancel := context.WithCancel(ctx)
	cut.Store(&cancel)
	_, ok, err := s.Claim(cctx, key, storetest.Token(), time.Minute, 0)
	cut.Store(nil)
	cancel()
	if ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim cut off after its claim = %v, %v; want context.Canceled", ok, err)
	}
	if got := recordToken(t, coll, key); got != owner {
		t.Fatalf("record token %q after the cut-off Claim; want the owner's record left", got)
	}
	time.Sleep(claimLease + 500*time.Millisecond) // the cut-off Claim's lease (the payload's) passes (a live one keeps others off: below)
	tok, ok := claimed(t, key)
	if !ok {
		t.Fatal("not claimed after the cut-off Claim's lease passed: the record is stuck in progress")
	}
	if got := recordToken(t, coll, key); got != tok {
		t.Fatalf("record token %q after the claim; want %q", got, tok)
	}
	if err := s.Complete(ctx, key, tok, []byte("response"), time.Hour); err != nil {
		t.Fatalf("Complete by the claim's token: %v", err)
	}

	for _, c := range []struct {
		name  string
		state int32
		lease time.Duration
		want  bool
	}{
		{"a live takeover", claimTakeover, time.Hour, false},
		{"a dead takeover", claimTakeover, -time.Minute, true},
		{"a live deletion", claimDeleting, time.Hour, false},
		{"a dead deletion", claimDeleting, -time.Minute, true},
	} {
		key, owner, gen := due(t)
		insertClaim(t, coll, key, gen, c.state, "other", "other-gen", "fp-a", time.Now().Add(c.lease))
		if tok, ok := claimed(t, key); ok != c.want {
			t.Errorf("Claim after %s claimed the record = %v; want %v", c.name, ok, c.want)
		} else if want := map[bool]string{true: tok, false: owner}[ok]; recordToken(t, coll, key) != want {
			t.Errorf("after %s: record token %q; want %q", c.name, recordToken(t, coll, key), want)
		}
	}
}
