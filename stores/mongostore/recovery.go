package mongostore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
)

var (
	_ idem.Recoverable  = (*Store)(nil)
	_ idem.StepResolver = (*Store)(nil)
)

// A record's recovery state ([idem.Recoverable]) is part of its document,
// beside its journal, and lives and dies with it as the journal does:
//
//	recovery: <payload, BSON binary>, attempts: <claims>,
//	backoff: <the last claim's backoff, ms>, dueAt: <when it is due, a hint>
//
// SetRecovery makes the record hold until and outlive it by the retain, as
// a first step does; a takeover of its fingerprint keeps the payload, any
// other takeover and Complete drop it. dueAt, indexed (sparse), is when to
// look at the record: when it was due as of its last write by
// SetRecovery, Claim or ResolveStep, or [RecoveryRecheck] after that write
// if sooner. An Extend to a lease shorter than RecoveryRecheck brings it
// forward to the new lease's end; other Extends, Suspend and a client's
// takeover leave it as it was, so Lapsed reads the records whose dueAt
// passed, answers those due, and moves the dueAt of the others the same
// way (or unsets it), each update pinned to the dueAt it read, and looks
// further.
const (
	fieldRecovery = "recovery"
	fieldRLease   = "rlease"
	fieldAttempts = "attempts"
	fieldBackoff  = "backoff"
	fieldDueAt    = "dueAt"
	dueIndexName  = "idem_due"
)

// RecoveryRecheck is the longest a record with a recovery payload goes
// without Lapsed looking at it again (see dueAt).
const RecoveryRecheck = 5 * time.Second

// lookAt returns the dueAt of a record due at at, written at now.
func lookAt(at bson.DateTime, now time.Time) bson.DateTime {
	return min(at, date(now.Add(RecoveryRecheck)))
}

// recoveryOpts reads a record without its response and journal.
var recoveryOpts = options.FindOne().SetProjection(bson.D{{Key: fieldResponse, Value: 0}, {Key: fieldSteps, Value: 0}})

// dueAt returns when d, read at now, is due for recovery, and false when
// it can never be (not in progress, uncertain or under Keep.Uncertain,
// expired, without a payload: read, or known by payload).
func (d *record) dueAt(now bson.DateTime, payload bool) (bson.DateTime, bool) {
	if d.State != stateInProgress || d.KeepU != 0 || !payload || d.ExpiresAt <= now || d.Until == 0 {
		return 0, false
	}
	return d.Until + bson.DateTime(d.Backoff), true
}

// pinned matches the version of d that was read: a write pinned to it
// changes nothing if the record changed since.
func pinned(d *record) bson.D {
	return bson.D{
		{Key: "_id", Value: d.ID},
		{Key: fieldToken, Value: d.Token},
		{Key: fieldState, Value: d.State},
		{Key: fieldGen, Value: genIs(d.Gen)},
		{Key: fieldExpiresAt, Value: d.ExpiresAt},
	}
}

// SetRecovery implements [idem.Recoverable.SetRecovery] in two round
// trips, as StartStep's first step: a find of the record, then an update
// pinned to the version read that stores the payload, the lease a claim
// takes (rlease), the retain (the
// larger), until and expiresAt (until + retain), and dueAt. Twice: the
// same values written again.
func (s *Store) SetRecovery(ctx context.Context, key, token string, payload []byte, retain, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch {
	case retain <= 0 || lease <= 0:
		return idem.ErrInvalidDuration
	case len(payload) > idem.MaxRecoveryBytes:
		return fmt.Errorf("mongostore: set recovery: %w: a %d-byte payload, at most idem.MaxRecoveryBytes", idem.ErrTooLarge, len(payload))
	case len(payload) == 0:
		return errors.New("mongostore: set recovery: empty payload")
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
	d, found, err := s.read(ctx, "set recovery", key)
	if err != nil {
		return err
	}
	if !found || !d.leased(token, date(now)) {
		return idem.ErrNotOwner
	}
	k := keepMs{d.KeepU, d.KeepT, max(d.Retain, millis(retain))}
	until := d.until()
	set := bson.D{
		{Key: fieldRecovery, Value: payload}, // marshalled into the command: a copy
		{Key: fieldRLease, Value: millis(lease)},
		{Key: fieldRetain, Value: k.r},
		{Key: fieldUntil, Value: until},
		{Key: fieldExpiresAt, Value: date(until.Time().Add(time.Duration(k.lapse()) * time.Millisecond))},
	}
	update := bson.D{{Key: "$set", Value: set}}
	if d.KeepU == 0 {
		update[0].Value = append(set, bson.E{Key: fieldDueAt, Value: lookAt(until+bson.DateTime(d.Backoff), now)})
	}
	res, err := s.coll.UpdateOne(ctx, pinned(&d), update)
	if err != nil {
		return fmt.Errorf("mongostore: set recovery: %w", err)
	}
	if res.MatchedCount == 0 {
		return idem.ErrNotOwner // changed since the read: an Extend by another Store of the owner, or lapsed
	}
	if _, n, ok := s.keeps.steps(key, token); ok {
		s.keeps.putSteps(key, token, k, n)
	} else {
		s.keeps.put(key, token, k)
	}
	return nil
}

// lapsedBudget bounds how long one Lapsed call looks past records whose
// dueAt passed but that are not due (at most half of what its context
// leaves): it starts no round that would end past it (by the last round's
// time), and then answers the due records it found; a later round's
// failure too.
const lapsedBudget = time.Second

// Lapsed implements [idem.Recoverable.Lapsed]: a find of up to limit
// records whose dueAt passed, through the sparse dueAt index, soonest
// first, and, for those not due after all, one update each (pinned to
// the dueAt read) that moves dueAt to when they will be due or unsets it,
// out of the next call's way. When it moved some, it finds again past the
// due ones, until limit records are due, every record whose dueAt passed
// was seen, or [lapsedBudget] passed. It answers the records due.
func (s *Store) Lapsed(ctx context.Context, limit int) ([]idem.LapsedRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, errors.New("mongostore: lapsed: limit must be > 0")
	}
	budget := lapsedBudget
	if d, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(d)/2)
	}
	end := time.Now().Add(budget)
	var due []idem.LapsedRecord
	for round := 0; ; round++ {
		start := time.Now()
		moved, full, err := s.lapsedRound(ctx, len(due), limit-len(due), &due)
		switch {
		case err != nil && round == 0:
			return nil, err
		case err != nil:
			return due, nil //nolint:nilerr // a later round failed: what the first ones found stands
		case moved == 0 || !full || len(due) >= limit || time.Now().Add(time.Since(start)).After(end):
			return due, nil // seen every record whose dueAt passed, or no time for another round
		}
	}
}

// lapsedRound finds up to count records whose dueAt passed, after the
// skip due ones found already (they stay first), appends those due to
// due, and moves or unsets the dueAt of the others. It returns how many it
// moved, and full: the find returned count records.
func (s *Store) lapsedRound(ctx context.Context, skip, count int, due *[]idem.LapsedRecord) (moved int, full bool, err error) {
	now, err := s.now(ctx)
	if err != nil {
		return 0, false, err
	}
	cur, err := s.coll.Find(ctx, bson.D{{Key: fieldDueAt, Value: bson.D{{Key: "$lte", Value: date(now)}}}},
		options.Find().SetSort(bson.D{{Key: fieldDueAt, Value: 1}}).SetSkip(int64(skip)).SetLimit(int64(count)).SetProjection(bson.D{
			{Key: fieldState, Value: 1}, {Key: fieldToken, Value: 1}, {Key: fieldFingerprint, Value: 1}, {Key: fieldGen, Value: 1},
			{Key: fieldExpiresAt, Value: 1}, {Key: fieldUntil, Value: 1}, {Key: fieldKeepU, Value: 1}, {Key: fieldAttempts, Value: 1},
			{Key: fieldBackoff, Value: 1}, {Key: fieldDueAt, Value: 1},
		}))
	if err != nil {
		return 0, false, fmt.Errorf("mongostore: lapsed: %w", err)
	}
	var docs []record
	if err := cur.All(ctx, &docs); err != nil {
		return 0, false, fmt.Errorf("mongostore: lapsed: %w", err)
	}
	for i := range docs {
		d := &docs[i]
		// A record with a dueAt has a payload: every write that drops the
		// payload (Complete, Resolve, another takeover) drops dueAt too.
		at, ok := d.dueAt(date(now), true)
		if ok && at <= date(now) && d.until() <= date(now) {
			*due = append(*due, idem.LapsedRecord{Key: d.ID, Attempts: int(d.Attempts)})
			continue
		}
		update := bson.D{{Key: "$unset", Value: bson.D{{Key: fieldDueAt, Value: ""}}}}
		if ok {
			update = bson.D{{Key: "$set", Value: bson.D{{Key: fieldDueAt, Value: lookAt(max(at, d.until()), now)}}}}
		}
		if _, err := s.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: d.ID}, {Key: fieldDueAt, Value: d.DueAt}}, update); err != nil {
			return 0, false, fmt.Errorf("mongostore: lapsed: %w", err)
		}
		moved++
	}
	return moved, len(docs) == count, nil
}

// Claim implements [idem.Recoverable.Claim] as Acquire takes a lapsed
// record over: a find of the record; when it is due, the insert of a claim
// ending the version read (the unique _id admits one, so of racing claims
// and client takeovers exactly one wins, on FerretDB too), then the
// rewrite of that version for token, for the lease rlease kept with the
// payload (lease for a payload stored without) (journal, payload and retain kept,
// one more attempt, backoff and dueAt stored): three round trips. A claim
// already there whose lease passed (its winner died, or its call timed out,
// before the rewrite) is followed as Acquire follows it: a claim on the
// version it granted, one more round trip each. A claim whose rewrite finds
// the record changed is withdrawn. Twice with the same token: the second
// finds the record leased, not due, and changes nothing.
func (s *Store) Claim(ctx context.Context, key, token string, lease, backoff time.Duration) (idem.RecoveryClaim, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.RecoveryClaim{}, false, err
	}
	if lease <= 0 || backoff < 0 {
		return idem.RecoveryClaim{}, false, idem.ErrInvalidDuration
	}
	now, err := s.now(ctx)
	if err != nil {
		return idem.RecoveryClaim{}, false, err
	}
	var d record
	err = decode(s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}, recoveryOpts), &d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments), errors.Is(err, idem.ErrCorrupt):
		return idem.RecoveryClaim{}, false, nil
	case err != nil:
		return idem.RecoveryClaim{}, false, fmt.Errorf("mongostore: claim: %w", err)
	}
	if at, ok := d.dueAt(date(now), len(d.Recovery) > 0); !ok || at > date(now) || d.until() > date(now) {
		return idem.RecoveryClaim{}, false, nil
	}
	if d.RLease > 0 { // the lease kept with the payload (none: stored by an earlier version)
		lease = time.Duration(d.RLease) * time.Millisecond
	}
	gen, end := newGen(), now.Add(lease)
	// A claim already taken names its successor: while the lease it
	// granted runs, a takeover or a deletion is under way; once it passed,
	// its winner died before rewriting the record (or its call timed out
	// after the insert applied), and its successor's version is claimed in
	// turn, as Acquire does. The rewrite below is pinned to the version
	// read, so a winner that rewrites late and this claim exclude each other.
	ended := d.version()
	for try := 1; ; try++ {
		won, w, err := s.insertClaim(ctx, key, ended, claim{
			State: stateClaimed, Token: token, Gen: gen, Fingerprint: d.Fingerprint,
			Lease: date(end), ExpiresAt: date(end.Add(claimKeep)),
		})
		if err != nil {
			return idem.RecoveryClaim{}, false, err
		}
		if won {
			break
		}
		if w == nil || w.Lease > date(now) || try == maxAcquireAttempts {
			return idem.RecoveryClaim{}, false, nil // purged meanwhile, or its lease runs: a later pass looks again
		}
		ended = w.Gen
	}
	b := millis(backoff)
	res, err := s.coll.UpdateOne(ctx, pinned(&d), bson.D{{Key: "$set", Value: bson.D{
		{Key: fieldToken, Value: token},
		{Key: fieldGen, Value: gen},
		{Key: fieldUntil, Value: date(end)},
		{Key: fieldExpiresAt, Value: date(end.Add(time.Duration(d.Retain) * time.Millisecond))},
		{Key: fieldAttempts, Value: d.Attempts + 1},
		{Key: fieldBackoff, Value: b},
		{Key: fieldDueAt, Value: lookAt(date(end.Add(time.Duration(b)*time.Millisecond)), now)},
	}}})
	if err == nil && res.MatchedCount == 1 {
		s.keeps.put(key, token, keepMs{0, d.KeepT, d.Retain})
		return idem.RecoveryClaim{
			Payload: d.Recovery, Fingerprint: d.Fingerprint, Attempts: int(d.Attempts) + 1,
			PreviousToken: d.Token, Lapsed: max(now.Sub(d.until().Time()), time.Millisecond),
		}, true, nil
	}
	if _, derr := s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: claimID(key, ended)}}); derr != nil && err == nil {
		err = derr
	}
	if err != nil {
		return idem.RecoveryClaim{}, false, fmt.Errorf("mongostore: claim: %w", err)
	}
	return idem.RecoveryClaim{}, false, nil // changed since the read
}

// ResolveStep implements [idem.StepResolver.ResolveStep] in two round
// trips: a find of the record, then, when it is uncertain or lapsed and
// holds the step not done, an update pinned to the version read that
// marks the step done (or removes it, moving each later entry's index
// down by one: pinned to nsteps too), drops the Keep.Uncertain (in
// progress, lapsed; kept for the retain from now when it was uncertain),
// drops the recovery attempts and backoff (counted from zero again) and,
// with a payload, sets dueAt to the lease's end (due at once). Twice: the second finds the step done
// or gone, [idem.ErrRecordChanged].
func (s *Store) ResolveStep(ctx context.Context, key, name string, result []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(result) > idem.MaxStepBytes {
		return fmt.Errorf("mongostore: resolve step: %w: a %d-byte result, at most idem.MaxStepBytes", idem.ErrTooLarge, len(result))
	}
	now, err := s.now(ctx)
	if err != nil {
		return err
	}
	var d record
	err = decode(s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}, options.FindOne().SetProjection(bson.D{{Key: fieldResponse, Value: 0}})), &d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return idem.ErrRecordChanged
	case err != nil:
		return fmt.Errorf("mongostore: resolve step: %w", err)
	}
	if d.State != stateInProgress || d.ExpiresAt <= date(now) || d.until() > date(now) {
		return idem.ErrRecordChanged
	}
	all, err := d.indexedSteps()
	if err != nil {
		return err
	}
	at := slices.IndexFunc(all, func(x indexedStep) bool { return x.e.Name == name })
	if at < 0 || all[at].e.Done {
		return idem.ErrRecordChanged
	}
	field := stepField(name)
	filter := append(pinned(&d), bson.E{Key: field + ".d", Value: false})
	set := bson.D{}
	unset := bson.D{{Key: fieldKeepU, Value: ""}, {Key: fieldAttempts, Value: ""}, {Key: fieldBackoff, Value: ""}}
	switch {
	case result != nil:
		set = append(set, bson.E{Key: field + ".d", Value: true}, bson.E{Key: field + ".r", Value: result})
	case len(all) == 1:
		unset = append(unset, bson.E{Key: fieldSteps, Value: ""}, bson.E{Key: fieldNSteps, Value: ""})
	default:
		// The later entries move down by one: the indexes stay 0 to
		// nsteps-1, in start order (see journal.go), pinned to nsteps.
		filter = append(filter, bson.E{Key: fieldNSteps, Value: msIs(int64(d.NSteps))})
		unset = append(unset, bson.E{Key: field, Value: ""})
		set = append(set, bson.E{Key: fieldNSteps, Value: int32(len(all) - 1)})
		for i, x := range slices.Delete(all, at, at+1) {
			if x.i != int32(i) {
				set = append(set, bson.E{Key: fieldSteps + "." + x.field + ".i", Value: int32(i)})
			}
		}
	}
	if d.KeepU > 0 {
		set = append(set, bson.E{Key: fieldExpiresAt, Value: date(now.Add(time.Duration(d.Retain) * time.Millisecond))})
	}
	if len(d.Recovery) > 0 {
		set = append(set, bson.E{Key: fieldDueAt, Value: d.until()})
	}
	update := bson.D{{Key: "$unset", Value: unset}}
	if len(set) > 0 {
		update = append(update, bson.E{Key: "$set", Value: set})
	}
	res, err := s.coll.UpdateOne(ctx, filter, update)
	if err != nil {
		return fmt.Errorf("mongostore: resolve step: %w", err)
	}
	if res.MatchedCount == 0 {
		return idem.ErrRecordChanged
	}
	return nil
}
