package mongostore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
)

var _ idem.Lister = (*Store)(nil)

// List implements [idem.Lister]: one find sorted by (expiresAt, _id), with
// a range on _id for a key prefix (_id >= prefix and < prefix + "g":
// scoped keys are hex), without the responses and step journals.
// In-progress records whose lease lapsed are listed (TTL <= 0) until the
// TTL index or a takeover removes them (a record with a step journal:
// until its retain ends), except under [idem.Keep.Uncertain]: those are
// listed as uncertain while their keep runs (TTL: until it ends). Expired completed
// records, tombstones and takeover claims are not listed. The cursor is
// the last record's expiry (Unix milliseconds) and key.
func (s *Store) List(ctx context.Context, q idem.ListQuery) (idem.ListPage, error) {
	if err := q.Check(); err != nil {
		return idem.ListPage{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.ListPage{}, err
	}
	now, err := s.now(ctx)
	if err != nil {
		return idem.ListPage{}, err
	}
	n := date(now)
	byState := map[idem.State]bson.D{
		// Lapsed in-progress records without a keep, or whose keep ended,
		// are listed (TTL <= 0) until purged or taken over.
		idem.StateInProgress: {{Key: fieldState, Value: stateInProgress}, {Key: "$or", Value: bson.A{
			bson.D{{Key: fieldUntil, Value: absent}},
			bson.D{{Key: fieldUntil, Value: bson.D{{Key: "$gt", Value: n}}}},
			bson.D{{Key: fieldExpiresAt, Value: bson.D{{Key: "$lte", Value: n}}}},
			bson.D{{Key: fieldKeepU, Value: absent}}, // kept past its lease for its journal
		}}},
		idem.StateUncertain: {
			{Key: fieldState, Value: stateInProgress},
			{Key: fieldKeepU, Value: bson.D{{Key: "$gt", Value: 0}}},
			{Key: fieldUntil, Value: bson.D{{Key: "$lte", Value: n}}},
			{Key: fieldExpiresAt, Value: bson.D{{Key: "$gt", Value: n}}},
		},
		// Tombstones (past their until) are never listed.
		idem.StateCompleted: {{Key: fieldState, Value: stateCompleted}, {Key: fieldExpiresAt, Value: bson.D{{Key: "$gt", Value: n}}}, {Key: "$or", Value: bson.A{
			bson.D{{Key: fieldUntil, Value: absent}},
			bson.D{{Key: fieldUntil, Value: bson.D{{Key: "$gt", Value: n}}}},
		}}},
	}
	var states bson.A
	for _, st := range []idem.State{idem.StateInProgress, idem.StateUncertain, idem.StateCompleted} {
		if q.State == 0 || q.State == st {
			states = append(states, byState[st])
		}
	}
	and := bson.A{bson.D{{Key: "$or", Value: states}}}
	filter := bson.D{}
	if q.KeyPrefix != "" {
		filter = append(filter, bson.E{Key: "_id", Value: bson.D{{Key: "$gte", Value: q.KeyPrefix}, {Key: "$lt", Value: q.KeyPrefix + "g"}}})
	}
	if q.Cursor != "" {
		ms, key, ok := strings.Cut(q.Cursor, ",")
		n, err := strconv.ParseInt(ms, 10, 64)
		if !ok || err != nil {
			return idem.ListPage{}, fmt.Errorf("mongostore: list: cursor %q was not returned by List", q.Cursor)
		}
		after := bson.DateTime(n)
		and = append(and, bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: fieldExpiresAt, Value: bson.D{{Key: "$gt", Value: after}}}},
			bson.D{{Key: fieldExpiresAt, Value: after}, {Key: "_id", Value: bson.D{{Key: "$gt", Value: key}}}},
		}}})
	}
	filter = append(filter, bson.E{Key: "$and", Value: and})
	opts := options.Find().SetSort(bson.D{{Key: fieldExpiresAt, Value: 1}, {Key: "_id", Value: 1}}).
		SetLimit(int64(q.Limit)).SetProjection(bson.D{{Key: fieldResponse, Value: 0}, {Key: fieldSteps, Value: 0}})
	cur, err := s.coll.Find(ctx, filter, opts)
	if err != nil {
		return idem.ListPage{}, fmt.Errorf("mongostore: list: %w", err)
	}
	var docs []record
	if err := cur.All(ctx, &docs); err != nil {
		return idem.ListPage{}, fmt.Errorf("mongostore: list: %w", err)
	}
	var page idem.ListPage
	for _, d := range docs {
		state, end := idem.StateInProgress, d.until()
		switch {
		case d.State == stateCompleted:
			state = idem.StateCompleted
		case end <= n && d.ExpiresAt > n && d.KeepU > 0:
			state, end = idem.StateUncertain, d.ExpiresAt
		}
		page.Records = append(page.Records, idem.ListedRecord{Key: d.ID, RecordInfo: idem.RecordInfo{
			Record: idem.Record{State: state, Token: d.Token, Fingerprint: d.Fingerprint},
			TTL:    end.Time().Sub(now).Round(time.Millisecond),
		}})
	}
	if len(docs) == q.Limit {
		last := docs[len(docs)-1]
		page.Next = strconv.FormatInt(int64(last.ExpiresAt), 10) + "," + last.ID
	}
	return page, nil
}
