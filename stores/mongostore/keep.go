package mongostore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
)

// keepMs is an [idem.Keep] as stored: milliseconds, 0 for none; and r,
// the retain of the record's step journal (see journal.go), 0 for none.
type keepMs struct{ u, t, r int64 }

// lapse returns how long an in-progress record under k outlives its
// lease, in milliseconds: Keep.Uncertain, else its journal's retain.
func (k keepMs) lapse() int64 {
	if k.u > 0 {
		return k.u
	}
	return k.r
}

// millis returns d in whole milliseconds, rounded up (a keep > 0 stays > 0).
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// withKeep returns fresh, an in-progress record whose lease ends at until,
// with the keep fields: until, keepU and keepT (each when > 0), and its
// expiresAt moved to until + keepU.
func withKeep(fresh bson.D, until time.Time, u, t int64) bson.D {
	for i := range fresh {
		if fresh[i].Key == fieldExpiresAt {
			fresh[i].Value = date(until.Add(time.Duration(u) * time.Millisecond))
		}
	}
	fresh = append(fresh, bson.E{Key: fieldUntil, Value: date(until)})
	if u > 0 {
		fresh = append(fresh, bson.E{Key: fieldKeepU, Value: u})
	}
	if t > 0 {
		fresh = append(fresh, bson.E{Key: fieldKeepT, Value: t})
	}
	return fresh
}

// takeover returns the update of a takeover's rewrite of the version old:
// $set fresh, the new in-progress record (its lease ending at until, under
// the keep u, t), and $unset the fields fresh does not set (the response,
// keep fields, a journal, a recovery payload). When resume, old's journal,
// recovery payload and retain go on:
// the record holds until, and expiresAt is until plus Keep.Uncertain, else
// the retain.
func takeover(fresh bson.D, until time.Time, u, t int64, old *record, resume bool) bson.D {
	set := fresh
	if resume {
		set = append(make(bson.D, 0, len(fresh)+5), fresh...) // fresh is reused by later attempts
		if u == 0 && t == 0 {
			set = withKeep(set, until, 0, 0)
		}
		for i := range set {
			if set[i].Key == fieldExpiresAt {
				set[i].Value = date(until.Add(time.Duration(keepMs{u, t, old.Retain}.lapse()) * time.Millisecond))
			}
		}
		set = append(set, bson.E{Key: fieldRetain, Value: old.Retain})
	}
	unset := bson.D{{Key: fieldResponse, Value: ""}}
	for _, f := range []string{fieldUntil, fieldKeepU, fieldKeepT, fieldRetain, fieldSteps, fieldNSteps, fieldRecovery, fieldAttempts, fieldBackoff, fieldDueAt} {
		found := resume && (f == fieldSteps || f == fieldNSteps || f == fieldRecovery || f == fieldAttempts || f == fieldBackoff || f == fieldDueAt)
		for _, e := range set {
			found = found || e.Key == f
		}
		if !found {
			unset = append(unset, bson.E{Key: f, Value: ""})
		}
	}
	return bson.D{{Key: "$set", Value: set}, {Key: "$unset", Value: unset}}
}

var (
	absent = bson.D{{Key: "$exists", Value: false}}
	// noKeep matches an in-progress record acquired without a Keep: only
	// records under a keep hold until.
	noKeep = bson.D{{Key: fieldUntil, Value: absent}}
)

// msIs matches a keep field holding v; 0 matches the field's absence.
func msIs(v int64) any {
	if v == 0 {
		return absent
	}
	return v
}

// keepIs matches an in-progress record acquired under k.
func keepIs(k keepMs) bson.D {
	if k == (keepMs{}) {
		return noKeep
	}
	return bson.D{{Key: fieldKeepU, Value: msIs(k.u)}, {Key: fieldKeepT, Value: msIs(k.t)}, {Key: fieldRetain, Value: msIs(k.r)}}
}

// ownedKept matches the in-progress record of key that token owns
// ([owned]) under k; a record kept past its lease for its journal (k.r > 0
// and no Keep.Uncertain) only while its lease (until) runs.
func ownedKept(key, token string, now time.Time, k keepMs) bson.D {
	f := append(owned(key, token, now), keepIs(k)...)
	if k.r > 0 && k.u == 0 {
		f = append(f, bson.E{Key: fieldUntil, Value: bson.D{{Key: "$gt", Value: date(now)}}})
	}
	return f
}

// completion is the update completing an in-progress record acquired under
// k with response for retention from now: without a tombstone keep the
// record expires when the retention ends; with one, until is the
// retention's end and expiresAt the tombstone's.
func completion(now time.Time, response []byte, retention time.Duration, k keepMs) bson.D {
	end := now.Add(retention)
	set := bson.D{
		{Key: fieldState, Value: stateCompleted},
		{Key: fieldExpiresAt, Value: date(end.Add(time.Duration(k.t) * time.Millisecond))},
		{Key: fieldResponse, Value: response}, // marshalled into the command: a copy
	}
	// The recovery payload goes (see recovery.go).
	unset := bson.D{{Key: fieldRecovery, Value: ""}, {Key: fieldDueAt, Value: ""}}
	switch {
	case k == (keepMs{}):
		return bson.D{{Key: "$set", Value: set}, {Key: "$unset", Value: unset}}
	case k.t == 0: // the lease's until goes: the record ends with its retention
		return bson.D{{Key: "$set", Value: set}, {Key: "$unset", Value: append(unset, bson.E{Key: fieldUntil, Value: ""})}}
	}
	return bson.D{{Key: "$set", Value: append(set, bson.E{Key: fieldUntil, Value: date(end)})}, {Key: "$unset", Value: unset}}
}

// keepOpts reads a record's keep fields only.
var keepOpts = options.FindOne().SetProjection(bson.D{{Key: fieldKeepU, Value: 1}, {Key: fieldKeepT, Value: 1}, {Key: fieldRetain, Value: 1}, {Key: fieldGen, Value: 1}})

// readKeep returns the keep of the record token owns, or [idem.ErrNotOwner].
func (s *Store) readKeep(ctx context.Context, key, token string, now time.Time) (keepMs, error) {
	var d record
	err := decode(s.coll.FindOne(ctx, owned(key, token, now), keepOpts), &d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments), errors.Is(err, idem.ErrCorrupt):
		return keepMs{}, idem.ErrNotOwner
	case err != nil:
		return keepMs{}, err
	}
	return keepMs{d.KeepU, d.KeepT, d.Retain}, nil
}

// keeps remembers the Keep of the leases this Store granted under a
// non-zero one, until their owner completes or releases them, so that
// Complete and Extend write them in one round trip. It is a hint: a
// record acquired by another Store (or a forgotten entry) costs a read of
// the record's own keep and a second write.
type keeps struct {
	mu sync.Mutex
	m  map[ownerID]keepMs
	n  map[ownerID]int32 // the number of steps in the journal of an owner's record, when this Store knows it
}

type ownerID struct{ key, token string }

// maxKeeps bounds the hints kept; past it they are all dropped (an owner
// that neither completes nor releases leaves its entry behind).
const maxKeeps = 1 << 14

func (k *keeps) put(key, token string, v keepMs) {
	if v == (keepMs{}) {
		return
	}
	k.mu.Lock()
	if k.m == nil || len(k.m) >= maxKeeps {
		k.m = map[ownerID]keepMs{}
	}
	k.m[ownerID{key, token}] = v
	k.mu.Unlock()
}

func (k *keeps) get(key, token string) (keepMs, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.m[ownerID{key, token}]
	return v, ok
}

func (k *keeps) drop(key, token string) {
	k.mu.Lock()
	if k.m != nil {
		delete(k.m, ownerID{key, token})
		delete(k.n, ownerID{key, token})
	}
	k.mu.Unlock()
}

// putSteps remembers the keep v and the n steps of the journal of the
// record token owns.
func (k *keeps) putSteps(key, token string, v keepMs, n int32) {
	k.put(key, token, v)
	k.mu.Lock()
	if k.n == nil || len(k.n) >= maxKeeps {
		k.n = map[ownerID]int32{}
	}
	k.n[ownerID{key, token}] = n
	k.mu.Unlock()
}

// steps returns the keep and the number of steps putSteps remembered.
func (k *keeps) steps(key, token string) (keepMs, int32, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok1 := k.m[ownerID{key, token}]
	n, ok2 := k.n[ownerID{key, token}]
	return v, n, ok1 && ok2
}

// freeResponse drops the response of the tombstone d, read at now, in one
// update filtered on the version read; a failure is only logged (Purge
// frees it too). It leaves alone a tombstone within deleteLease of its
// end: on FerretDB, whose updates read and then replace by _id, an unset
// delayed past the end could otherwise write the tombstone back over the
// record of a request that took the key over.
func (s *Store) freeResponse(ctx context.Context, d *record, now time.Time) {
	if len(d.Response) == 0 || d.ExpiresAt <= date(now.Add(s.deleteLease)) {
		return
	}
	_, err := s.coll.UpdateOne(ctx, bson.D{
		{Key: "_id", Value: d.ID},
		{Key: fieldState, Value: stateCompleted},
		{Key: fieldToken, Value: d.Token},
		{Key: fieldGen, Value: genIs(d.Gen)},
		{Key: fieldExpiresAt, Value: d.ExpiresAt},
	}, unsetResponse)
	if err != nil {
		s.logger.DebugContext(ctx, "mongostore: free a tombstone's response", "key", d.ID[:min(16, len(d.ID))], "error", err)
	}
}

// unsetResponse frees a tombstone's response and journal.
var unsetResponse = bson.D{{Key: "$unset", Value: bson.D{{Key: fieldResponse, Value: ""}, {Key: fieldSteps, Value: ""}, {Key: fieldNSteps, Value: ""}}}}

// uncertain matches key's record when it is uncertain at now: in
// progress, its lease lapsed, its Keep.Uncertain running.
func uncertain(key string, now time.Time) bson.D {
	return bson.D{
		{Key: "_id", Value: key},
		{Key: fieldState, Value: stateInProgress},
		{Key: fieldKeepU, Value: bson.D{{Key: "$gt", Value: 0}}},
		{Key: fieldUntil, Value: bson.D{{Key: "$lte", Value: date(now)}}},
		{Key: fieldExpiresAt, Value: bson.D{{Key: "$gt", Value: date(now)}}},
	}
}

// Resolve implements [idem.Keeper.Resolve]. With a nil response it is one
// deleteOne matching only an uncertain record. Otherwise it reads the
// record's keep (a find) and completes it in one update matching only the
// same uncertain version under that keep, for retention and then its
// tombstone keep. Errors: ctx's error, [idem.ErrInvalidDuration] when a
// response comes with retention <= 0, [idem.ErrRecordChanged] when the
// record is not uncertain (absent, live, completed, a tombstone),
// [ErrTooLarge] wrapped, server errors wrapped.
func (s *Store) Resolve(ctx context.Context, key string, response []byte, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if response != nil && retention <= 0 {
		return idem.ErrInvalidDuration
	}
	if size, limit := len(response)+len(key)+docOverhead, s.clk.maxDocSize(); size > limit {
		return fmt.Errorf("mongostore: resolve %.16s: record of about %d bytes, limit %d: %w", key, size, limit, ErrTooLarge)
	}
	now, err := s.now(ctx)
	if err != nil {
		return err
	}
	if response == nil {
		res, err := s.coll.DeleteOne(ctx, uncertain(key, now))
		if err != nil {
			return fmt.Errorf("mongostore: resolve: %w", err)
		}
		if res.DeletedCount == 0 {
			return idem.ErrRecordChanged
		}
		return nil
	}
	var d record
	err = decode(s.coll.FindOne(ctx, uncertain(key, now), keepOpts), &d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments), errors.Is(err, idem.ErrCorrupt):
		return idem.ErrRecordChanged
	case err != nil:
		return fmt.Errorf("mongostore: resolve: %w", err)
	}
	k := keepMs{d.KeepU, d.KeepT, d.Retain}
	filter := append(uncertain(key, now), bson.E{Key: fieldGen, Value: genIs(d.Gen)})
	filter = append(filter, keepIs(k)...)
	res, err := s.coll.UpdateOne(ctx, filter, completion(now, response, retention, k))
	if err != nil {
		return fmt.Errorf("mongostore: resolve: %w", err)
	}
	if res.MatchedCount == 0 {
		return idem.ErrRecordChanged
	}
	return nil
}
