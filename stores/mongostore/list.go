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
// scoped keys are hex), without the responses. In-progress records whose
// lease lapsed are listed (TTL <= 0) until the TTL index or a takeover
// removes them; expired completed records and takeover claims are not. The
// cursor is the last record's expiry (Unix milliseconds) and key.
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
	states := bson.A{stateInProgress, stateCompleted}
	if q.State != 0 {
		states = bson.A{storedState[q.State]}
	}
	filter := bson.D{
		{Key: fieldState, Value: bson.D{{Key: "$in", Value: states}}},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: fieldState, Value: stateInProgress}},
			bson.D{{Key: fieldExpiresAt, Value: bson.D{{Key: "$gt", Value: date(now)}}}},
		}},
	}
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
		filter = append(filter, bson.E{Key: "$and", Value: bson.A{bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: fieldExpiresAt, Value: bson.D{{Key: "$gt", Value: after}}}},
			bson.D{{Key: fieldExpiresAt, Value: after}, {Key: "_id", Value: bson.D{{Key: "$gt", Value: key}}}},
		}}}}})
	}
	opts := options.Find().SetSort(bson.D{{Key: fieldExpiresAt, Value: 1}, {Key: "_id", Value: 1}}).
		SetLimit(int64(q.Limit)).SetProjection(bson.D{{Key: fieldResponse, Value: 0}})
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
		state := idem.StateInProgress
		if d.State == stateCompleted {
			state = idem.StateCompleted
		}
		page.Records = append(page.Records, idem.ListedRecord{Key: d.ID, RecordInfo: idem.RecordInfo{
			Record: idem.Record{State: state, Token: d.Token, Fingerprint: d.Fingerprint},
			TTL:    d.ExpiresAt.Time().Sub(now).Round(time.Millisecond),
		}})
	}
	if len(docs) == q.Limit {
		last := docs[len(docs)-1]
		page.Next = strconv.FormatInt(int64(last.ExpiresAt), 10) + "," + last.ID
	}
	return page, nil
}
