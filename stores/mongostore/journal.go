package mongostore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
)

// A record's step journal ([idem.Journal]) is part of its document, so it
// lives and dies with it:
//
//	retain: <the journal's retain, ms>, nsteps: <number of steps>,
//	steps: { <hex of the step's name>: { i: <index, in start order>,
//	         t: <token that started it>, d: <done>, r: <result, BSON binary> } }
//
// A record with a journal also holds until (the end of its lease), and its
// expiresAt is until plus its Keep.Uncertain, else its retain: past until
// it is kept, in progress, for a takeover of its fingerprint to resume
// (see [Store.AcquireKeep]). Step names are hex-encoded because field
// names cannot hold '.' or start with '$'. Each journal write is one update
// filtered on the owner's live lease (until > now); FerretDB v1 runs the
// operators used ($set, $unset, $exists, $gt, $gte) as MongoDB does.

// step is one entry of a record's journal.
type step struct {
	I int32  `bson:"i"`
	T string `bson:"t"`
	D bool   `bson:"d"`
	R []byte `bson:"r,omitempty"`
}

// stepField returns the path of step name's entry in a record.
func stepField(name string) string { return fieldSteps + "." + hex.EncodeToString([]byte(name)) }

// journalOpts reads a record without its response and recovery payload.
var journalOpts = options.FindOne().SetProjection(bson.D{{Key: fieldResponse, Value: 0}, {Key: fieldRecovery, Value: 0}})

// leaseLive matches a record whose lease runs at now, for a record with a
// journal (which holds until).
func leaseLive(now time.Time) bson.E {
	return bson.E{Key: fieldUntil, Value: bson.D{{Key: "$gt", Value: date(now)}}}
}

// steps decodes d's journal, in start order; Results are the caller's.
func (d *record) steps() ([]idem.StepEntry, error) {
	if len(d.Steps) == 0 {
		return nil, nil
	}
	elems, err := d.Steps.Elements()
	if err != nil {
		return nil, fmt.Errorf("mongostore: %w: record %.16s: journal: %w", idem.ErrCorrupt, d.ID, err)
	}
	type indexed struct {
		i int32
		e idem.StepEntry
	}
	all := make([]indexed, 0, len(elems))
	for _, el := range elems {
		name, err1 := hex.DecodeString(el.Key())
		var st step
		err2 := el.Value().Unmarshal(&st)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("mongostore: %w: record %.16s: journal entry %q", idem.ErrCorrupt, d.ID, el.Key())
		}
		e := idem.StepEntry{Name: string(name), Token: st.T, Done: st.D}
		if st.D {
			e.Result = append([]byte{}, st.R...)
		}
		all = append(all, indexed{st.I, e})
	}
	slices.SortFunc(all, func(a, b indexed) int { return int(a.i - b.i) })
	out := make([]idem.StepEntry, len(all))
	for i, x := range all {
		out[i] = x.e
	}
	return out, nil
}

// read returns key's record without its response; found is false when
// there is none.
func (s *Store) read(ctx context.Context, op, key string) (d record, found bool, err error) {
	err = decode(s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}, journalOpts), &d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return record{}, false, nil
	case err != nil:
		return record{}, false, fmt.Errorf("mongostore: %s: %w", op, err)
	}
	return d, true, nil
}

// StartStep implements [idem.Journal.StartStep]: a new step of a record
// whose journal this Store started or resumed is one update (the entry
// $set, nsteps pinned and counted); otherwise a find of the record
// answers an existing entry (one round trip), or is followed by one
// update, pinned to the version read, that adds the entry and, for the
// first step or a larger retain, moves expiresAt to until + retain. It
// waits for the same owner's other writes in this Store.
func (s *Store) StartStep(ctx context.Context, key, token, name string, retain time.Duration) (idem.StepEntry, error) {
	if err := ctx.Err(); err != nil {
		return idem.StepEntry{}, err
	}
	if retain <= 0 {
		return idem.StepEntry{}, idem.ErrInvalidDuration
	}
	unlock, err := s.owners.lock(ctx, key, token)
	if err != nil {
		return idem.StepEntry{}, err
	}
	defer unlock()
	r := millis(retain)
	field := stepField(name)
	entry := idem.StepEntry{Name: name, Token: token}
	for range maxAcquireAttempts {
		now, err := s.now(ctx)
		if err != nil {
			return idem.StepEntry{}, err
		}
		if k, n, ok := s.keeps.steps(key, token); ok && k.r >= r && n < idem.MaxSteps {
			res, err := s.coll.UpdateOne(ctx,
				append(append(owned(key, token, now), leaseLive(now)), bson.E{Key: fieldRetain, Value: k.r},
					bson.E{Key: fieldNSteps, Value: n}, bson.E{Key: field, Value: absent}),
				bson.D{{Key: "$set", Value: bson.D{
					{Key: field, Value: step{I: n, T: token}},
					{Key: fieldNSteps, Value: n + 1},
				}}})
			if err != nil {
				return idem.StepEntry{}, fmt.Errorf("mongostore: start step: %w", err)
			}
			if res.MatchedCount == 1 {
				s.keeps.putSteps(key, token, k, n+1)
				return entry, nil
			}
		}
		d, found, err := s.read(ctx, "start step", key)
		if err != nil {
			return idem.StepEntry{}, err
		}
		if !found || !d.leased(token, date(now)) {
			return idem.StepEntry{}, idem.ErrNotOwner
		}
		steps, err := d.steps()
		if err != nil {
			return idem.StepEntry{}, err
		}
		for _, e := range steps {
			if e.Name == name {
				k := keepMs{d.KeepU, d.KeepT, d.Retain}
				s.keeps.putSteps(key, token, k, int32(len(steps)))
				return e, nil
			}
		}
		if len(steps) >= idem.MaxSteps {
			return idem.StepEntry{}, idem.ErrTooManySteps
		}
		k := keepMs{d.KeepU, d.KeepT, max(d.Retain, r)}
		n := int32(len(steps))
		until := d.until()
		res, err := s.coll.UpdateOne(ctx,
			bson.D{
				{Key: "_id", Value: key},
				{Key: fieldToken, Value: token},
				{Key: fieldState, Value: stateInProgress},
				{Key: fieldGen, Value: genIs(d.Gen)},
				{Key: fieldExpiresAt, Value: d.ExpiresAt},
				{Key: fieldNSteps, Value: msIs(int64(n))},
				{Key: field, Value: absent},
			},
			bson.D{{Key: "$set", Value: bson.D{
				{Key: field, Value: step{I: n, T: token}},
				{Key: fieldNSteps, Value: n + 1},
				{Key: fieldRetain, Value: k.r},
				{Key: fieldUntil, Value: until},
				{Key: fieldExpiresAt, Value: date(until.Time().Add(time.Duration(k.lapse()) * time.Millisecond))},
			}}})
		if err != nil {
			return idem.StepEntry{}, fmt.Errorf("mongostore: start step: %w", err)
		}
		if res.MatchedCount == 1 {
			s.keeps.putSteps(key, token, k, n+1)
			return entry, nil
		}
		// Changed since the read (an Extend by another Store of the owner): again.
	}
	return idem.StepEntry{}, fmt.Errorf("mongostore: start step %.16s: %w", key, ErrContention)
}

// FinishStep implements [idem.Journal.FinishStep] in one update ($set of
// the entry's d and r, filtered on the owner's live lease and the entry
// not done); when it matches nothing, a find tells a done entry (nil) from
// a lost lease or a missing entry ([idem.ErrNotOwner]). The result is
// stored as BSON binary: about len(result) + 10 bytes more in the record.
func (s *Store) FinishStep(ctx context.Context, key, token, name string, result []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(result) > idem.MaxStepBytes {
		return fmt.Errorf("mongostore: finish step: %w: a %d-byte result, at most idem.MaxStepBytes", idem.ErrTooLarge, len(result))
	}
	if result == nil {
		result = []byte{}
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
	field := stepField(name)
	res, err := s.coll.UpdateOne(ctx,
		append(append(owned(key, token, now), leaseLive(now)), bson.E{Key: field + ".d", Value: false}),
		bson.D{{Key: "$set", Value: bson.D{
			{Key: field + ".d", Value: true},
			{Key: field + ".r", Value: result}, // marshalled into the command: a copy
		}}})
	if err != nil {
		return fmt.Errorf("mongostore: finish step: %w", err)
	}
	if res.MatchedCount == 1 {
		return nil
	}
	d, found, err := s.read(ctx, "finish step", key)
	if err != nil {
		return err
	}
	if !found || !d.leased(token, date(now)) {
		return idem.ErrNotOwner
	}
	steps, err := d.steps()
	if err != nil {
		return err
	}
	for _, e := range steps {
		if e.Name == name && e.Done {
			return nil // a retried call whose reply was lost
		}
	}
	return idem.ErrNotOwner
}

// Suspend implements [idem.Journal.Suspend] in two round trips: a find of
// the record, then an update pinned to the version read that makes it
// uncertain (until now, keepU keep, expiresAt now + keep), its journal
// kept.
func (s *Store) Suspend(ctx context.Context, key, token string, keep time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if keep <= 0 {
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
	d, found, err := s.read(ctx, "suspend", key)
	if err != nil {
		return err
	}
	if !found || !d.leased(token, date(now)) {
		return idem.ErrNotOwner
	}
	u := millis(keep)
	res, err := s.coll.UpdateOne(ctx,
		bson.D{
			{Key: "_id", Value: key},
			{Key: fieldToken, Value: token},
			{Key: fieldState, Value: stateInProgress},
			{Key: fieldGen, Value: genIs(d.Gen)},
			{Key: fieldExpiresAt, Value: d.ExpiresAt},
		},
		bson.D{{Key: "$set", Value: bson.D{
			{Key: fieldUntil, Value: date(now)},
			{Key: fieldKeepU, Value: u},
			{Key: fieldExpiresAt, Value: date(now.Add(keep))},
		}}})
	if err != nil {
		return fmt.Errorf("mongostore: suspend: %w", err)
	}
	if res.MatchedCount == 0 {
		return idem.ErrNotOwner
	}
	s.keeps.put(key, token, keepMs{u, d.KeepT, d.Retain}) // its owner may still complete or release it
	return nil
}

// Steps implements [idem.Journal.Steps] in one round trip (a find of the
// live record, without its response).
func (s *Store) Steps(ctx context.Context, key string) ([]idem.StepEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now, err := s.now(ctx)
	if err != nil {
		return nil, err
	}
	d, found, err := s.read(ctx, "steps", key)
	if err != nil || !found || d.ExpiresAt <= date(now) || d.State == stateCompleted && d.until() <= date(now) {
		return nil, err // absent, expired, or a tombstone
	}
	return d.steps()
}
