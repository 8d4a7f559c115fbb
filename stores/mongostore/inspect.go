package mongostore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	idem "github.com/idemkit/idem/core"
)

var _ idem.Inspector = (*Store)(nil)

// storedState maps a record state to its value in the state field.
var storedState = map[idem.State]int32{
	idem.StateInProgress: stateInProgress, idem.StateCompleted: stateCompleted,
	idem.StateUncertain: stateInProgress, idem.StateExpired: stateCompleted, // past their until
}

// Inspect implements [idem.Inspector.Inspect] in one round trip (a find
// with the collection's read preference); the time to live is counted on
// the server's clock: to the end of the lease or retention, or, for an
// uncertain record or a tombstone, of its keep.
func (s *Store) Inspect(ctx context.Context, key string) (idem.RecordInfo, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.RecordInfo{}, false, err
	}
	now, err := s.now(ctx)
	if err != nil {
		return idem.RecordInfo{}, false, err
	}
	var d record
	err = decode(s.coll.FindOne(ctx, live(key, now)), &d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return idem.RecordInfo{}, false, nil
	}
	if err != nil {
		return idem.RecordInfo{}, false, fmt.Errorf("mongostore: inspect: %w", err)
	}
	rec, err := d.toRecord(date(now))
	if err != nil {
		return idem.RecordInfo{}, false, err
	}
	end := d.until()
	if end <= date(now) && !(d.State == stateInProgress && d.KeepU == 0) { // a lapsed lease kept for its journal: TTL < 0
		end = d.ExpiresAt
	}
	return idem.RecordInfo{Record: rec, TTL: end.Time().Sub(now)}, true, nil
}

// Evict implements [idem.Inspector.Evict] in one round trip: a delete of
// the live record matching the state (uncertain and expired included),
// token and fingerprint seen.
func (s *Store) Evict(ctx context.Context, key string, seen idem.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	state, ok := storedState[seen.State]
	if !ok {
		return idem.ErrRecordChanged
	}
	now, err := s.now(ctx)
	if err != nil {
		return err
	}
	filter := append(live(key, now),
		bson.E{Key: fieldState, Value: state},
		bson.E{Key: fieldToken, Value: seen.Token},
		bson.E{Key: fieldFingerprint, Value: seen.Fingerprint})
	filter = append(filter, untilState(seen.State, now)...)
	res, err := s.coll.DeleteOne(ctx, filter)
	if err != nil {
		return fmt.Errorf("mongostore: evict: %w", err)
	}
	if res.DeletedCount == 0 {
		return idem.ErrRecordChanged
	}
	return nil
}

// live matches key's record unless it has expired.
func live(key string, now time.Time) bson.D {
	return bson.D{
		{Key: "_id", Value: key},
		{Key: fieldExpiresAt, Value: bson.D{{Key: "$gt", Value: date(now)}}},
	}
}

// untilState matches, among records of the stored state of st, those in
// st at now: past their until for [idem.StateUncertain] (under
// Keep.Uncertain) and [idem.StateExpired], before it (or without one) for
// the others, and, for [idem.StateInProgress], past it without
// Keep.Uncertain (kept for a step journal).
func untilState(st idem.State, now time.Time) bson.D {
	lapsed := bson.E{Key: fieldUntil, Value: bson.D{{Key: "$lte", Value: date(now)}}}
	switch st {
	case idem.StateUncertain:
		return bson.D{lapsed, {Key: fieldKeepU, Value: bson.D{{Key: "$gt", Value: 0}}}}
	case idem.StateExpired:
		return bson.D{lapsed}
	}
	or := bson.A{
		bson.D{{Key: fieldUntil, Value: absent}},
		bson.D{{Key: fieldUntil, Value: bson.D{{Key: "$gt", Value: date(now)}}}},
	}
	if st == idem.StateInProgress {
		or = append(or, bson.D{{Key: fieldKeepU, Value: absent}})
	}
	return bson.D{{Key: "$or", Value: or}}
}
