package mongostore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
)

// Index names created by EnsureIndexes.
const (
	ttlIndexName   = "idem_expiresAt_ttl"
	plainIndexName = "idem_expiresAt"
	untilIndexName = "idem_until"
)

// freeBatch and maxFreeBatches bound the tombstones whose responses one
// Purge frees: batches of freeBatch, at most maxFreeBatches of them.
const (
	freeBatch      = 1000
	maxFreeBatches = 10
)

// codeNotImplemented is the server error code FerretDB answers a TTL index with.
const codeNotImplemented = 238

// EnsureIndexes creates the TTL index on expiresAt (expireAfterSeconds 0), so
// the server deletes expired records by itself, about once a minute, and a
// sparse index on until (held only by records under an [idem.Keep]), for
// Purge to find the tombstones whose responses it frees. It is idempotent,
// and run again on a collection indexed by an earlier version it adds the
// until index. A server that rejects TTL indexes (FerretDB: NotImplemented,
// code 238) gets a plain index on expiresAt instead, for [Store.Purge]; the
// fallback is logged at warning level and EnsureIndexes returns nil: the
// store stays correct (reads ignore expired records), but only Purge or
// [Store.StartPurger] frees the space. Other errors are returned wrapped.
func (s *Store) EnsureIndexes(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	keys := bson.D{{Key: fieldExpiresAt, Value: 1}}
	_, err := s.coll.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys:    keys,
		Options: options.Index().SetName(ttlIndexName).SetExpireAfterSeconds(0),
	})
	var se mongo.ServerError
	if err == nil || !errors.As(err, &se) || !se.HasErrorCode(codeNotImplemented) {
		if err != nil {
			return fmt.Errorf("mongostore: create TTL index: %w", err)
		}
		return s.ensureUntilIndex(ctx)
	}
	s.logger.WarnContext(ctx, "mongostore: server rejects TTL indexes; expired records are ignored by reads but deleted only by Purge",
		"collection", s.coll.Name(), "error", err)
	if _, err := s.coll.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys: keys, Options: options.Index().SetName(plainIndexName),
	}); err != nil {
		return fmt.Errorf("mongostore: create index on %s: %w", fieldExpiresAt, err)
	}
	return s.ensureUntilIndex(ctx)
}

// ensureUntilIndex creates the sparse indexes on until and on dueAt
// ([Store.Lapsed]).
func (s *Store) ensureUntilIndex(ctx context.Context) error {
	for _, ix := range [...]struct{ field, name string }{{fieldUntil, untilIndexName}, {fieldDueAt, dueIndexName}} {
		if _, err := s.coll.Indexes().CreateOne(ctx, mongo.IndexModel{
			Keys: bson.D{{Key: ix.field, Value: 1}}, Options: options.Index().SetName(ix.name).SetSparse(true),
		}); err != nil {
			return fmt.Errorf("mongostore: create index on %s: %w", ix.field, err)
		}
	}
	return nil
}

// Purge deletes the expired records (expiresAt <= server time) and claims,
// and returns how many records it deleted. A record is deleted only after
// the insert of a claim on its version (see Acquire), so a purge never
// deletes a record that a takeover is rewriting, on servers whose deletes
// are not atomic either (FerretDB deletes by _id what an earlier read
// matched). It costs four round trips: a find of the expired documents
// (_id, state and token only), one unordered insert of the purge claims,
// one delete of the claimed records and one of the expired claims. Then
// it frees the responses of tombstones ([idem.Keep.Tombstone]) whose
// retention ended: a find of up to 1000 of them and one updateMany
// unsetting their responses, repeated while batches are full (at most 10
// batches per call). Errors: ctx's error, server errors wrapped.
func (s *Store) Purge(ctx context.Context) (deleted int64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	now, err := s.now(ctx)
	if err != nil {
		return 0, err
	}
	cur, err := s.coll.Find(ctx, bson.D{{Key: fieldExpiresAt, Value: bson.D{{Key: "$lte", Value: date(now)}}}},
		options.Find().SetProjection(bson.D{{Key: fieldState, Value: 1}, {Key: fieldToken, Value: 1}, {Key: fieldGen, Value: 1}}))
	if err != nil {
		return 0, fmt.Errorf("mongostore: purge: %w", err)
	}
	var expired []record
	if err := cur.All(ctx, &expired); err != nil {
		return 0, fmt.Errorf("mongostore: purge: %w", err)
	}
	var records, claims []string
	var docs []any
	for _, r := range expired {
		if r.State != stateInProgress && r.State != stateCompleted {
			claims = append(claims, r.ID)
			continue
		}
		records = append(records, r.ID)
		docs = append(docs, claim{
			ID: claimID(r.ID, r.version()), State: stateDeleting, Gen: newGen(),
			Lease: date(now.Add(s.deleteLease)), ExpiresAt: date(now.Add(s.deleteLease + claimKeep)),
		})
	}
	if len(docs) > 0 {
		won, err := s.insertClaims(ctx, records, docs)
		if err != nil {
			return 0, err
		}
		if len(won) > 0 {
			// expiresAt again: on MongoDB the TTL monitor may have deleted
			// a record and a new one taken its _id since the find.
			res, err := s.coll.DeleteMany(ctx, bson.D{
				{Key: "_id", Value: bson.D{{Key: "$in", Value: won}}},
				{Key: fieldExpiresAt, Value: bson.D{{Key: "$lte", Value: date(now)}}},
			})
			if err != nil {
				return 0, fmt.Errorf("mongostore: purge: %w", err)
			}
			deleted = res.DeletedCount
		}
	}
	if len(claims) > 0 {
		if _, err := s.coll.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: claims}}}}); err != nil {
			return deleted, fmt.Errorf("mongostore: purge claims: %w", err)
		}
	}
	return deleted, s.freeTombstones(ctx, now)
}

// freeTombstones unsets the responses of the tombstones whose retention
// ended before now, in bounded batches. A tombstone within deleteLease of
// its end is left to the purge that deletes it (see freeResponse).
func (s *Store) freeTombstones(ctx context.Context, now time.Time) error {
	filter := bson.D{
		{Key: fieldUntil, Value: bson.D{{Key: "$lte", Value: date(now)}}},
		{Key: fieldState, Value: stateCompleted},
		{Key: fieldExpiresAt, Value: bson.D{{Key: "$gt", Value: date(now.Add(s.deleteLease))}}},
		{Key: fieldResponse, Value: bson.D{{Key: "$exists", Value: true}}},
	}
	for range maxFreeBatches {
		cur, err := s.coll.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetLimit(freeBatch))
		if err != nil {
			return fmt.Errorf("mongostore: purge tombstones: %w", err)
		}
		var docs []struct {
			ID string `bson:"_id"`
		}
		if err := cur.All(ctx, &docs); err != nil {
			return fmt.Errorf("mongostore: purge tombstones: %w", err)
		}
		if len(docs) == 0 {
			return nil
		}
		ids := make(bson.A, len(docs))
		for i, d := range docs {
			ids[i] = d.ID
		}
		if _, err := s.coll.UpdateMany(ctx, append(filter[:len(filter):len(filter)], bson.E{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}), unsetResponse); err != nil {
			return fmt.Errorf("mongostore: purge tombstones: %w", err)
		}
		if len(docs) < freeBatch {
			return nil
		}
	}
	return nil
}

// insertClaims inserts the purge claims docs of the records ids (same
// order) in one unordered insert and returns the ids whose claim it won;
// a duplicate _id means a takeover or another purge claimed it first.
func (s *Store) insertClaims(ctx context.Context, ids []string, docs []any) ([]string, error) {
	_, err := s.coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	lost := map[int]bool{}
	var bwe mongo.BulkWriteException
	switch {
	case err == nil:
	case errors.As(err, &bwe) && bwe.WriteConcernError == nil:
		for _, we := range bwe.WriteErrors {
			if !mongo.IsDuplicateKeyError(we) {
				return nil, fmt.Errorf("mongostore: purge claim: %w", err)
			}
			lost[we.Index] = true
		}
	default:
		return nil, fmt.Errorf("mongostore: purge claim: %w", err)
	}
	won := make([]string, 0, len(ids))
	for i, id := range ids {
		if !lost[i] {
			won = append(won, id)
		}
	}
	return won, nil
}

// StartPurger starts a goroutine that calls Purge every interval, each call
// bounded by the interval (at most one minute), logging failures at warning
// level; [Store.Close] stops it. Use it where TTL indexes are unavailable.
// Errors: [idem.ErrInvalidDuration] when interval <= 0, an error when a
// purger already runs or the store is closed.
func (s *Store) StartPurger(interval time.Duration) error {
	if interval <= 0 {
		return idem.ErrInvalidDuration
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errors.New("mongostore: StartPurger on a closed store")
	case s.stop != nil:
		return errors.New("mongostore: purger already started")
	}
	ctx, stop := context.WithCancel(context.Background())
	s.stop, s.stopped = stop, make(chan struct{})
	go s.purger(ctx, interval, s.stopped)
	return nil
}

func (s *Store) purger(ctx context.Context, interval time.Duration, stopped chan struct{}) {
	defer close(stopped)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, min(interval, time.Minute))
		n, err := s.Purge(pctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			s.logger.Warn("mongostore: purge failed", "collection", s.coll.Name(), "error", err)
		case n > 0:
			s.logger.Debug("mongostore: purged expired records", "collection", s.coll.Name(), "deleted", n)
		}
	}
}

// Close stops the purger, if one runs, and waits for it; a purge in flight
// is cancelled. It never disconnects the borrowed client, and the store stays
// usable except for StartPurger. It is safe to call more than once and
// always returns nil.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	stop, stopped := s.stop, s.stopped
	s.mu.Unlock()
	if stop != nil {
		stop()
		<-stopped
	}
	return nil
}
