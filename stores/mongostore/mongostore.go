package mongostore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
)

// ErrTooLarge is returned (wrapped) by Complete when the stored record would
// not fit the server's maximum BSON document size (maxBsonObjectSize from
// hello, 16 MiB on MongoDB). Nothing is written: the caller still holds its
// lease and may complete again with a smaller response. The engine's
// WithMaxResponseBytes (1 MiB by default) keeps responses far below the limit.
var ErrTooLarge = fmt.Errorf("mongostore: response exceeds the maximum BSON document size: %w", idem.ErrTooLarge)

// ErrContention is returned (wrapped) by Acquire when the record changed under
// it on every attempt (takeovers lost to other requests, each of which then
// vanished). It is a system failure: the engine answers 503 and executes nothing.
var ErrContention = errors.New("mongostore: record changed on every acquire attempt")

// DefaultClockRefresh is how often the server-clock offset is measured again
// unless [WithClockRefresh] says otherwise.
const DefaultClockRefresh = 30 * time.Second

// Document field names.
const (
	fieldState       = "state"
	fieldToken       = "token"
	fieldFingerprint = "fingerprint"
	fieldExpiresAt   = "expiresAt"
	fieldResponse    = "response"
	fieldGen         = "gen"
	fieldUntil       = "until"
	fieldKeepU       = "keepU"
	fieldKeepT       = "keepT"
	fieldRetain      = "retain"
	fieldSteps       = "steps"
	fieldNSteps      = "nsteps"
)

// Values of the state field. Records hold 1 or 2; claims (see claim) 3 or 4.
const (
	stateInProgress int32 = 1
	stateCompleted  int32 = 2
	stateClaimed    int32 = 3 // a takeover claim: the successor is an in-progress record
	stateDeleting   int32 = 4 // a release or purge claim: the record is being deleted
)

// maxAcquireAttempts bounds Acquire's retries after a lost takeover or a
// duplicate-key answer to a racing upsert, and the claims one attempt
// follows.
const maxAcquireAttempts = 4

// claimKeep is how long a claim outlives the lease it grants: long enough
// for every request that read the record version it ends to find it.
const claimKeep = time.Minute

// deleteLease is the least time a release or purge claim keeps takeovers
// of the record it deletes away: far longer than the delete that follows
// the claim takes to reach the server. A Release's claim also lasts as long
// as the owner's lease, before whose end nobody could take the key over
// anyway. A deleter that died between its claim and its delete is taken
// over once the claim's lease lapsed, as after a crash mid-handler.
const deleteLease = 10 * time.Second

// claimSep separates a record's key from the generation of the version a
// claim ends in the claim's _id. Generations never contain it.
const claimSep = "~"

// docOverhead is a generous bound on the bytes of a record other than the
// response: _id, token, fingerprint, state, expiresAt and BSON framing.
const docOverhead = 1024

var (
	_ idem.Store    = (*Store)(nil)
	_ idem.Extender = (*Store)(nil)
	_ idem.Keeper   = (*Store)(nil)
	_ idem.Journal  = (*Store)(nil)
)

// Store is an [idem.Store], [idem.Extender] and [idem.Keeper] on a MongoDB
// collection. It is safe for concurrent use. It borrows the collection:
// Close never disconnects the client.
type Store struct {
	coll    *mongo.Collection
	logger  *slog.Logger
	refresh time.Duration
	clk     clock

	owners owners // one owner's writes, one at a time
	keeps  keeps  // the Keep of the leases this Store granted under one

	deleteLease time.Duration // deleteLease; shorter in tests

	mu      sync.Mutex
	closed  bool
	stop    context.CancelFunc // stops the purger; nil when none runs
	stopped chan struct{}      // closed when the purger has returned
}

// owners serialises the writes of one owner (key and token) within a
// Store: the engine renews a lease while it completes or releases the
// record, and on a server whose updates read and then replace by _id
// (FerretDB) a renewal overlapping a completion could write the
// in-progress record back over the completed one.
type owners struct {
	mu sync.Mutex
	m  map[string]*ownerTurn
}

type ownerTurn struct {
	ch      chan struct{} // holds one token while a write runs
	waiters int           // callers holding or waiting for ch
}

// lock waits for the turn of key's owner token, or for ctx; the returned
// function ends the turn.
func (o *owners) lock(ctx context.Context, key, token string) (func(), error) {
	id := key + claimSep + token
	o.mu.Lock()
	if o.m == nil {
		o.m = map[string]*ownerTurn{}
	}
	t := o.m[id]
	if t == nil {
		t = &ownerTurn{ch: make(chan struct{}, 1)}
		o.m[id] = t
	}
	t.waiters++
	o.mu.Unlock()
	leave := func() {
		o.mu.Lock()
		if t.waiters--; t.waiters == 0 {
			delete(o.m, id)
		}
		o.mu.Unlock()
	}
	select {
	case t.ch <- struct{}{}:
		return func() { <-t.ch; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	}
}

// Option configures a Store.
type Option func(*Store)

// WithLogger sets the logger for EnsureIndexes' fallback and the purger's
// failures. Optional. Default is slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(s *Store) {
		if l != nil {
			s.logger = l
		}
	}
}

// WithClockRefresh sets how often the offset between the local clock and the
// server's clock (hello's localTime) is measured again; each measurement
// costs one round trip, made by the operation that finds the offset stale.
// Optional. Default is 30s; d <= 0 keeps the default.
func WithClockRefresh(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.refresh = d
		}
	}
}

// New returns a Store keeping its records in coll. It does no I/O: the
// server clock is first read by the first operation, and indexes are created
// by [Store.EnsureIndexes]. Set the write concern (majority for payments) and
// read preference (primary) on coll; the store uses them as given.
func New(coll *mongo.Collection, opts ...Option) *Store {
	s := &Store{coll: coll, logger: slog.Default(), refresh: DefaultClockRefresh, deleteLease: deleteLease}
	for _, o := range opts {
		o(s)
	}
	return s
}

// record is the stored document. A record acquired under a non-zero
// [idem.Keep] also holds until, keepU and keepT; expiresAt is then until
// plus the keep of its state (in progress: keepU, completed: keepT), the
// time the TTL index and Purge delete it.
type record struct {
	ID          string        `bson:"_id"`
	State       int32         `bson:"state"`
	Token       string        `bson:"token"`
	Gen         string        `bson:"gen,omitempty"` // random, new with each owner
	Fingerprint string        `bson:"fingerprint"`
	ExpiresAt   bson.DateTime `bson:"expiresAt"`
	Response    []byte        `bson:"response,omitempty"`
	Until       bson.DateTime `bson:"until,omitempty"`    // keep only: end of the lease or retention; absent: expiresAt
	KeepU       int64         `bson:"keepU,omitempty"`    // Keep.Uncertain, milliseconds
	KeepT       int64         `bson:"keepT,omitempty"`    // Keep.Tombstone, milliseconds
	Retain      int64         `bson:"retain,omitempty"`   // journal only: its retain, milliseconds
	NSteps      int32         `bson:"nsteps,omitempty"`   // journal only: its number of steps
	Steps       bson.Raw      `bson:"steps,omitempty"`    // journal only: hex(name) -> step (see journal.go)
	Recovery    []byte        `bson:"recovery,omitempty"` // in progress only: the recovery payload (see recovery.go)
	RLease      int64         `bson:"rlease,omitempty"`   // with the payload: the lease a recovery claim takes, milliseconds
	Attempts    int32         `bson:"attempts,omitempty"` // recovery claims
	Backoff     int64         `bson:"backoff,omitempty"`  // the last claim's backoff, milliseconds
	DueAt       bson.DateTime `bson:"dueAt,omitempty"`    // when the record is due for recovery, a hint
}

// leased reports whether token holds the live lease of d at now.
func (d *record) leased(token string, now bson.DateTime) bool {
	return d.State == stateInProgress && d.Token == token && d.ExpiresAt > now && d.until() > now
}

// lapsedJournal reports whether d, live at now, is an in-progress record
// kept past its lease for its journal (no Keep.Uncertain): a takeover of
// its fingerprint resumes it.
func (d *record) lapsedJournal(now bson.DateTime) bool {
	return d.State == stateInProgress && d.KeepU == 0 && d.until() <= now
}

// until returns the end of the record's lease or retention.
func (d *record) until() bson.DateTime {
	if d.Until != 0 {
		return d.Until
	}
	return d.ExpiresAt
}

// version names the version of the record a claim ends: its generation,
// or its token for a record written before generations were.
func (d *record) version() string {
	if d.Gen != "" {
		return d.Gen
	}
	return d.Token
}

// genIs matches the generation gen; "" matches a record without one.
func genIs(gen string) bson.D {
	if gen == "" {
		return bson.D{{Key: "$exists", Value: false}}
	}
	return bson.D{{Key: "$eq", Value: gen}}
}

// newGen returns a fresh generation.
func newGen() string { return rand.Text() }

// toRecord converts a stored document that has not expired to the record
// the engine sees at now: past its until, an in-progress record is
// uncertain (under Keep.Uncertain; otherwise it is kept for its journal,
// still in progress) and a completed one a tombstone (expired, no
// response).
func (d *record) toRecord(now bson.DateTime) (idem.Record, error) {
	rec := idem.Record{Fingerprint: d.Fingerprint, Token: d.Token}
	switch d.State {
	case stateInProgress:
		rec.State = idem.StateInProgress
		if d.until() <= now && d.KeepU > 0 {
			rec.State = idem.StateUncertain
		}
	case stateCompleted:
		rec.State = idem.StateCompleted
		if d.until() <= now {
			rec.State = idem.StateExpired
			return rec, nil
		}
		if len(d.Response) == 0 {
			return idem.Record{}, fmt.Errorf("mongostore: %w: record %.16s: completed without a response", idem.ErrCorrupt, d.ID)
		}
		rec.Response = d.Response // the BSON decoder copies binary values: the caller's
	default:
		return idem.Record{}, fmt.Errorf("mongostore: %w: record %.16s: state %d", idem.ErrCorrupt, d.ID, d.State)
	}
	return rec, nil
}

func date(t time.Time) bson.DateTime { return bson.NewDateTimeFromTime(t) }

// leaseLeft is [idem.Record.LeaseLeft] of a live lease ending at end, by
// the server's clock now (taken just before the read, so it may run a
// round trip long).
func leaseLeft(end bson.DateTime, now time.Time) time.Duration {
	return max(end.Time().Sub(now), time.Millisecond)
}

// owned matches the in-progress record of key whose live lease token
// holds, or that token owns while it is uncertain (its keep runs).
func owned(key, token string, now time.Time) bson.D {
	d := make(bson.D, 4, 7)
	d[0] = bson.E{Key: "_id", Value: key}
	d[1] = bson.E{Key: fieldToken, Value: token}
	d[2] = bson.E{Key: fieldState, Value: stateInProgress}
	d[3] = bson.E{Key: fieldExpiresAt, Value: bson.D{{Key: "$gt", Value: date(now)}}}
	return d
}

var acquireOpts = options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.Before)

// claim is the document that decides who ends one version of a record. Its
// _id is the record's key, claimSep and the generation of the version it
// ends (claimID): the unique _id index admits one insert of it, so of all
// the requests taking over one expired record exactly one wins, on every
// MongoDB-wire server, including those whose conditional updates are not
// atomic (FerretDB). It holds the successor the winner grants itself (its
// token, generation, fingerprint and lease end) so that losers can answer
// from it before the winner has rewritten the record.
type claim struct {
	ID          string        `bson:"_id"`
	State       int32         `bson:"state"` // stateClaimed or stateDeleting
	Token       string        `bson:"token"`
	Gen         string        `bson:"gen"`
	Fingerprint string        `bson:"fingerprint"`
	Lease       bson.DateTime `bson:"lease"`     // end of the successor's first lease
	ExpiresAt   bson.DateTime `bson:"expiresAt"` // the claim's own expiry, for the TTL index and Purge
}

func claimID(key, version string) string { return key + claimSep + version }

// insertClaim tries to end the version ended of key, granting c.
// It reports whether this call won; a loser gets the winner's claim, or
// nil when the claim vanished meanwhile (purged).
func (s *Store) insertClaim(ctx context.Context, key, ended string, c claim) (won bool, winner *claim, err error) {
	c.ID = claimID(key, ended)
	_, err = s.coll.InsertOne(ctx, c)
	if err == nil {
		return true, nil, nil
	}
	if !mongo.IsDuplicateKeyError(err) {
		return false, nil, fmt.Errorf("mongostore: claim: %w", err)
	}
	var w claim
	err = decode(s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: c.ID}}), &w)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return false, nil, nil
	case err != nil:
		return false, nil, fmt.Errorf("mongostore: read claim: %w", err)
	}
	return false, &w, nil
}

// Acquire implements [idem.Store.Acquire]: it is AcquireKeep(..., Keep{}).
func (s *Store) Acquire(ctx context.Context, key, token, fingerprint string, lease time.Duration) (idem.Record, bool, error) {
	return s.AcquireKeep(ctx, key, token, fingerprint, lease, idem.Keep{})
}

// AcquireKeep implements [idem.Keeper.AcquireKeep] (and Acquire): one round
// trip when the key is free or live (a findAndModify upsert that inserts
// only when _id is free); three when it takes over an expired record
// (insert of the claim naming the expired version, then the rewrite of the
// record). An uncertain record or a tombstone has not expired (its
// expiresAt is its keep's end), so it is answered, never taken over; the
// first Acquire that finds a tombstone still holding its response frees it
// (one more round trip). Errors: ctx's error when ctx is done,
// [idem.ErrInvalidDuration] when lease <= 0 or a keep duration < 0, server
// errors wrapped, [ErrContention] wrapped.
func (s *Store) AcquireKeep(ctx context.Context, key, token, fingerprint string, lease time.Duration, keep idem.Keep) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	if lease <= 0 || keep.Uncertain < 0 || keep.Tombstone < 0 {
		return idem.Record{}, false, idem.ErrInvalidDuration
	}
	keepU, keepT := millis(keep.Uncertain), millis(keep.Tombstone)
	gen := newGen()
attempts:
	for range maxAcquireAttempts {
		now, err := s.now(ctx)
		if err != nil {
			return idem.Record{}, false, err
		}
		fresh := bson.D{
			{Key: fieldState, Value: stateInProgress},
			{Key: fieldToken, Value: token},
			{Key: fieldGen, Value: gen},
			{Key: fieldFingerprint, Value: fingerprint},
			{Key: fieldExpiresAt, Value: date(now.Add(lease))},
		}
		if keepU != 0 || keepT != 0 {
			fresh = withKeep(fresh, now.Add(lease), keepU, keepT)
		}
		// Inserts fresh when _id is free, else returns the record untouched.
		// MongoDB retries an upsert that hits a duplicate _id as an update.
		var old record
		err = decode(s.coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: key}},
			bson.D{{Key: "$setOnInsert", Value: fresh}}, acquireOpts), &old)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			s.keeps.put(key, token, keepMs{keepU, keepT, 0})
			return idem.Record{}, true, nil // inserted: acquired
		case mongo.IsDuplicateKeyError(err):
			continue // a racing upsert inserted first (FerretDB); read it again
		case err != nil:
			return idem.Record{}, false, fmt.Errorf("mongostore: acquire: %w", err)
		}
		resume := old.ExpiresAt > date(now) && old.lapsedJournal(date(now))
		if resume && old.Fingerprint != fingerprint { // the key's first request left effects
			return idem.Record{State: idem.StateInProgress, Token: old.Token, Fingerprint: old.Fingerprint}, false, nil
		}
		if old.ExpiresAt > date(now) && !resume {
			rec, err := old.toRecord(date(now))
			switch rec.State {
			case idem.StateInProgress:
				rec.LeaseLeft = leaseLeft(old.until(), now)
			case idem.StateExpired:
				s.freeResponse(ctx, &old, now)
			}
			return rec, false, err
		}
		// Expired, or lapsed with a journal: claim the version read, then
		// rewrite exactly that version (a resumed one keeps its journal).
		// A claim already taken names its successor: answer from it while
		// its lease runs, else claim the successor's version in turn (its
		// winner never rewrote the record, or did and lapsed meanwhile).
		ended := old.version()
		for range maxAcquireAttempts {
			won, w, err := s.insertClaim(ctx, key, ended, claim{
				State: stateClaimed, Token: token, Gen: gen, Fingerprint: fingerprint,
				Lease: date(now.Add(lease)), ExpiresAt: date(now.Add(lease + claimKeep)),
			})
			if err != nil {
				return idem.Record{}, false, err
			}
			switch {
			case won || w != nil && w.Gen == gen: // won now, or in an earlier attempt
				res, err := s.coll.UpdateOne(ctx,
					bson.D{
						{Key: "_id", Value: key},
						{Key: fieldToken, Value: old.Token},
						{Key: fieldState, Value: old.State},
						{Key: fieldExpiresAt, Value: old.ExpiresAt},
						{Key: fieldGen, Value: genIs(old.Gen)},
					},
					takeover(fresh, now.Add(lease), keepU, keepT, &old, resume))
				if err != nil {
					return idem.Record{}, false, fmt.Errorf("mongostore: take over expired record: %w", err)
				}
				if res.MatchedCount == 1 {
					if resume {
						s.keeps.put(key, token, keepMs{keepU, keepT, old.Retain})
					} else {
						s.keeps.put(key, token, keepMs{keepU, keepT, 0})
					}
					if old.State != stateInProgress || old.KeepU > 0 {
						return idem.Record{}, true, nil
					}
					lapsed := old.until().Time().Sub(now)
					return idem.Record{State: idem.StateInProgress, Token: old.Token, LeaseLeft: min(lapsed, -time.Millisecond)}, true, nil
				}
				continue attempts // deleted or rewritten meanwhile: look again
			case w == nil, w.State == stateDeleting && w.Lease > date(now):
				continue attempts // deleted meanwhile, or being deleted: look again
			case w.Lease > date(now):
				return idem.Record{State: idem.StateInProgress, Token: w.Token, Fingerprint: w.Fingerprint, LeaseLeft: leaseLeft(w.Lease, now)}, false, nil
			}
			ended = w.Gen
		}
	}
	return idem.Record{}, false, fmt.Errorf("mongostore: acquire %.16s: %w", key, ErrContention)
}

// Complete implements [idem.Store.Complete] in one round trip: a $set of
// state, expiresAt and response on the record token holds, keeping its
// fingerprint. It waits for the same owner's Extend or Release in flight in
// this Store, so that a renewal cannot undo the completion. Errors: ctx's
// error, [idem.ErrInvalidDuration] when retention <= 0, [idem.ErrNotOwner],
// [ErrTooLarge] wrapped (nothing written), server errors wrapped.
func (s *Store) Complete(ctx context.Context, key, token string, response []byte, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if retention <= 0 {
		return idem.ErrInvalidDuration
	}
	unlock, err := s.owners.lock(ctx, key, token)
	if err != nil {
		return err
	}
	defer unlock()
	now, err := s.now(ctx)
	if err != nil {
		return err
	}
	if size, limit := len(response)+len(key)+len(token)+docOverhead, s.clk.maxDocSize(); size > limit {
		return fmt.Errorf("mongostore: complete %.16s: record of about %d bytes, limit %d: %w", key, size, limit, ErrTooLarge)
	}
	err = s.updateKept(ctx, "complete", key, token, now, func(k keepMs) bson.D { return completion(now, response, retention, k) })
	if err == nil {
		s.keeps.drop(key, token)
	}
	return err
}

// Release implements [idem.Store.Release] in three round trips: a find of
// the record (one when token does not hold it), the insert of a claim
// ending its version (so that no takeover of it can win while the record
// is deleted), then a delete of the in-progress record token holds; when
// that finds nothing, a fourth withdraws the claim. A Release cut off
// between its claim and its delete leaves the key to a takeover once the
// owner's lease or 10s lapsed, whichever is later. Errors: ctx's error,
// [idem.ErrNotOwner], server errors wrapped.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	unlock, err := s.owners.lock(ctx, key, token)
	if err != nil {
		return err
	}
	defer unlock()
	now, err := s.now(ctx)
	if err != nil {
		return err
	}
	var d record
	err = decode(s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}, releaseOpts), &d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments), errors.Is(err, idem.ErrCorrupt): // a foreign document is nobody's lease
		return idem.ErrNotOwner
	case err != nil:
		return fmt.Errorf("mongostore: release: %w", err)
	case d.Token != token || d.State != stateInProgress || d.ExpiresAt <= date(now) || d.lapsedJournal(date(now)):
		s.keeps.drop(key, token)
		return idem.ErrNotOwner
	}
	defer s.keeps.drop(key, token)
	end := now.Add(s.deleteLease)
	// The owner's lease end (until, not the retention a journal's record is
	// kept for): a claim left by a Release whose delete found the lease
	// lapsed must not block takeovers and recovery claims for the retention.
	if owner := d.until().Time(); owner.After(end) {
		end = owner
	}
	won, w, err := s.insertClaim(ctx, key, d.version(), claim{
		State: stateDeleting, Gen: newGen(), Lease: date(end), ExpiresAt: date(end.Add(claimKeep)),
	})
	if err != nil {
		return err
	}
	if !won && (w == nil || w.State != stateDeleting) {
		return idem.ErrNotOwner // taken over
	}
	// Won, or an earlier Release of token claimed and its delete failed.
	filter := append(owned(key, token, now), bson.E{Key: fieldGen, Value: genIs(d.Gen)})
	if d.Retain > 0 && d.KeepU == 0 { // a lease kept past for a journal: live only before until
		filter = append(filter, bson.E{Key: fieldUntil, Value: bson.D{{Key: "$gt", Value: date(now)}}})
	}
	res, err := s.coll.DeleteOne(ctx, filter)
	if err != nil {
		return fmt.Errorf("mongostore: release: %w", err)
	}
	if res.DeletedCount == 0 {
		if won { // nothing left to delete: take the claim back
			if _, err := s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: claimID(key, d.version())}}); err != nil {
				return fmt.Errorf("mongostore: release: withdraw claim: %w", err)
			}
		}
		return idem.ErrNotOwner
	}
	return nil
}

// releaseOpts leaves the response out of Release's read.
var releaseOpts = options.FindOne().SetProjection(bson.D{
	{Key: fieldState, Value: 1}, {Key: fieldToken, Value: 1}, {Key: fieldGen, Value: 1}, {Key: fieldExpiresAt, Value: 1},
	{Key: fieldUntil, Value: 1}, {Key: fieldKeepU, Value: 1}, {Key: fieldRetain, Value: 1},
})

// Extend implements [idem.Extender] in one round trip: a $set of expiresAt
// to now+lease on the in-progress record token holds; a lease shorter than
// [RecoveryRecheck] costs one more, which brings a recovery payload's
// dueAt forward to the new lease's end (see recovery.go). Errors: ctx's error,
// [idem.ErrInvalidDuration] when lease <= 0, [idem.ErrNotOwner], server
// errors wrapped.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if lease <= 0 {
		return idem.ErrInvalidDuration
	}
	unlock, err := s.owners.lock(ctx, key, token)
	if err != nil {
		return err
	}
	defer unlock()
	now, err := s.now(ctx)
	if err != nil {
		return err
	}
	err = s.updateKept(ctx, "extend", key, token, now, func(k keepMs) bson.D {
		set := bson.D{{Key: fieldExpiresAt, Value: date(now.Add(lease + time.Duration(k.lapse())*time.Millisecond))}}
		if k != (keepMs{}) {
			set = append(set, bson.E{Key: fieldUntil, Value: date(now.Add(lease))})
		}
		return bson.D{{Key: "$set", Value: set}}
	})
	if err != nil || lease >= RecoveryRecheck {
		return err
	}
	// A lease shortened below RecoveryRecheck (a run that ends without an
	// answer lets its lease lapse now): a record with a recovery payload
	// looked at later than the new lease's end is looked at then (Lapsed
	// adds the backoff), so that its lapse is noticed at once. One more
	// round trip, only for such leases; a record without a dueAt has no
	// payload and is left alone.
	until := date(now.Add(lease))
	if _, err := s.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: fieldToken, Value: token}, {Key: fieldDueAt, Value: bson.D{{Key: "$gt", Value: until}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: fieldDueAt, Value: until}}}}); err != nil {
		return fmt.Errorf("mongostore: extend: %w", err)
	}
	return nil
}

// updateKept applies update, built for the record's keep, to the record
// token owns, for Complete and Extend: pinned to the Keep this Store
// acquired the record with (none if another Store did), one round trip
// when that is right; when it matches nothing, pinned once more to the
// keep read from the record (acquired elsewhere, under another Keep).
// [idem.ErrNotOwner] when token owns no record.
func (s *Store) updateKept(ctx context.Context, op, key, token string, now time.Time, update func(keepMs) bson.D) error {
	k, _ := s.keeps.get(key, token)
	for try := 0; ; try++ {
		res, err := s.coll.UpdateOne(ctx, ownedKept(key, token, now, k), update(k))
		if err != nil {
			return fmt.Errorf("mongostore: %s: %w", op, err)
		}
		if res.MatchedCount == 1 {
			return nil
		}
		if try > 0 {
			s.keeps.drop(key, token)
			return idem.ErrNotOwner
		}
		stored, err := s.readKeep(ctx, key, token, now)
		switch {
		case errors.Is(err, idem.ErrNotOwner), err == nil && stored == k:
			s.keeps.drop(key, token)
			return idem.ErrNotOwner
		case err != nil:
			return fmt.Errorf("mongostore: %s: %w", op, err)
		}
		k = stored
	}
}

// Get implements [idem.Store.Get] in one round trip (a find with the
// collection's read preference). Errors: ctx's error, server errors wrapped,
// a corrupt record.
func (s *Store) Get(ctx context.Context, key string) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	now, err := s.now(ctx)
	if err != nil {
		return idem.Record{}, false, err
	}
	// The filter is _id alone, expiry checked here: FerretDB uses its _id
	// index only for a filter that is exactly {_id: value}.
	var d record
	err = decode(s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}), &d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return idem.Record{}, false, nil
	}
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("mongostore: get: %w", err)
	}
	if d.ExpiresAt <= date(now) {
		return idem.Record{}, false, nil
	}
	rec, err := d.toRecord(date(now))
	if err != nil {
		return idem.Record{}, false, err
	}
	if rec.State == idem.StateExpired {
		s.freeResponse(ctx, &d, now)
	}
	return rec, true, nil
}

// decode reads res into v. A document that does not fit v (a field of
// another BSON type, written by something other than this package) is
// reported wrapping [idem.ErrCorrupt], so the engine answers 500
// "stored-result-unreadable" rather than 503 as for a store failure.
func decode(res *mongo.SingleResult, v any) error {
	raw, err := res.Raw()
	if err != nil {
		return err
	}
	if err := bson.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%w: %w", idem.ErrCorrupt, err)
	}
	return nil
}
