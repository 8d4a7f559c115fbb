package mongostore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mongostore"
)

// seed fills coll with n completed records of small responses, big of them
// holding a 1 MiB response instead, as accumulated retention leaves them.
// It returns the key of the last small record inserted (a server that scans
// in insertion order reaches it last).
func seed(tb testing.TB, coll *mongo.Collection, n, big int) string {
	tb.Helper()
	ctx := ctxT(tb)
	small := benchResponse
	large := append([]byte{1, 0xc8, 0x01, 0}, make([]byte, 1<<20)...) // a 200 with a 1 MiB body
	exp := bson.NewDateTimeFromTime(time.Now().Add(time.Hour))
	var last string
	for done := 0; done < n; {
		var docs []any
		for ; done < n && len(docs) < 500; done++ {
			key, resp := storetest.Key(), small
			if done < big {
				resp = large
			} else {
				last = key
			}
			docs = append(docs, bson.D{
				{Key: "_id", Value: key}, {Key: "state", Value: int32(2)}, {Key: "token", Value: storetest.Token()},
				{Key: "fingerprint", Value: "fp"}, {Key: "expiresAt", Value: exp}, {Key: "response", Value: resp},
			})
		}
		if _, err := coll.InsertMany(ctx, docs); err != nil {
			tb.Fatalf("seed: %v", err)
		}
	}
	return last
}

// bigRecords is how many seeded records hold a 1 MiB response.
var bigRecords = 10

// BenchmarkAccumulated measures the store's decisions against a collection
// holding 10^3 and 10^4 records, bigRecords of them with 1 MiB responses:
// a Get and a replay (one lookup by _id each), a find filtered on _id and
// expiresAt, and a first execution (Acquire and Complete). Run it against
// the server in question, e.g.
//
//	go test -run '^$' -bench Accumulated -benchtime 20x
func BenchmarkAccumulated(b *testing.B) {
	c, _ := shared(b)
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			coll := collection(b, c)
			key := seed(b, coll, n, bigRecords)
			s := mongostore.New(coll)
			ctx := context.Background()
			b.Run("get", func(b *testing.B) {
				for b.Loop() {
					if _, found, err := s.Get(ctx, key); err != nil || !found {
						b.Fatalf("Get = %v, %v", found, err)
					}
				}
			})
			// What any filter beyond _id costs on the server: Complete,
			// Extend, Release and the takeover's rewrite filter on the owner.
			b.Run("find-id-and-expiry", func(b *testing.B) {
				for b.Loop() {
					f := bson.D{{Key: "_id", Value: key}, {Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: bson.NewDateTimeFromTime(time.Now())}}}}
					if err := coll.FindOne(ctx, f).Err(); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("replay", func(b *testing.B) {
				for b.Loop() {
					if rec, ok, err := s.Acquire(ctx, key, storetest.Token(), "fp", time.Minute); err != nil || ok || rec.Response == nil {
						b.Fatalf("replay Acquire = %v, %v", ok, err)
					}
				}
			})
			b.Run("first-execution", func(b *testing.B) {
				for b.Loop() {
					k, tok := storetest.Key(), storetest.Token()
					if _, ok, err := s.Acquire(ctx, k, tok, "fp", time.Minute); err != nil || !ok {
						b.Fatalf("Acquire = %v, %v", ok, err)
					}
					if err := s.Complete(ctx, k, tok, benchResponse, time.Hour); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkBurstRecovery sends a burst of concurrent first executions
// through an engine whose store timeout (2s, the default) the burst
// exceeds, on a collection of 10^3 records (bigRecords of them with 1 MiB
// responses), then measures how long single requests keep failing:
// recovery-s is the time from the end of the burst to the first single
// request executed, 503/op the burst's store-unavailable answers. (At 10^4
// records a single first execution on FerretDB+SQLite already takes longer
// than the store timeout on a loaded 2-core machine: see
// BenchmarkAccumulated.) Run it alone:
//
//	go test -run '^$' -bench BurstRecovery -benchtime 2x
func BenchmarkBurstRecovery(b *testing.B) {
	c, _ := shared(b)
	coll := collection(b, c)
	seed(b, coll, 1_000, bigRecords)
	burstRecovery(b, coll)
}

func burstRecovery(b *testing.B, coll *mongo.Collection) {
	e, err := idem.New(mongostore.New(coll), idem.WithLogger(quiet))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Close(context.Background()) })
	run := func(key string) int {
		x, resp := e.Begin(context.Background(), payment(key, `{"amount":1}`))
		if resp != nil {
			return resp.Status
		}
		_, _ = x.Write([]byte(`{"id":"pay_1"}`))
		x.Finish(201, nil)
		return 201
	}
	const burst = 64
	var recovery time.Duration
	var unavailable int
	for b.Loop() {
		statuses := make(chan int, burst)
		for range burst {
			go func() { statuses <- run(storetest.Key()) }()
		}
		for range burst {
			if <-statuses == 503 {
				unavailable++
			}
		}
		end := time.Now()
		for deadline := end.Add(time.Minute); run(storetest.Key()) != 201; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("no single request executed within a minute of the burst")
			}
		}
		recovery += time.Since(end)
	}
	b.ReportMetric(recovery.Seconds()/float64(b.N), "recovery-s")
	b.ReportMetric(float64(unavailable)/float64(b.N), "503/op")
}
