package benchmarks

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/idemkit/idem/benchmarks/internal/harness"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/mongostore"
)

// benchResponse is what the store benchmarks complete with: the engine's
// encoding of a 201 with Content-Type, Location and respBody.
var benchResponse = engineEncoding(http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_1"}}, respBody)

// engineEncoding returns the bytes a store's Complete receives for a 201
// with header and body: recorded through an engine on a memstore.
func engineEncoding(header http.Header, body []byte) []byte {
	s := memstore.New(memstore.WithCleanupInterval(0))
	e, err := idem.New(s, idem.WithGlobalScope())
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	x, _ := e.Begin(ctx, &idem.Request{Method: http.MethodPost, Path: "/", Keys: []string{`"k"`}})
	_, _ = x.Write(body)
	x.Finish(http.StatusCreated, header.Clone())
	rec, _, err := s.Get(ctx, idem.ScopedKey("", http.MethodPost, "/", "k"))
	if err != nil || rec.Response == nil {
		panic(fmt.Sprintf("engineEncoding: %+v, %v", rec, err))
	}
	return rec.Response
}

// retention of records written by the benchmarks: long enough for a run,
// short enough to leave nothing behind in a shared Redis.
const benchRetention = harness.Retention

// storeCase opens one store for a benchmark. trips counts the store's
// network round trips (commands sent), nil for the memory store.
type storeCase struct {
	name string
	open func(tb testing.TB) (s idem.Store, trips *atomic.Int64)
}

var storeCases = []storeCase{
	{name: "memory", open: openMem},
	{name: "redis", open: openRedis},
	{name: "mongo", open: openMongo},
	{name: "postgres", open: openPostgres},
	{name: "mysql", open: openMySQL},
}

func openMem(tb testing.TB) (idem.Store, *atomic.Int64) {
	s := memstore.New(memstore.WithMaxRecords(1<<40), memstore.WithCleanupInterval(0))
	tb.Cleanup(func() { s.Close() })
	return s, nil
}

// newRedisClient is harness.NewRedisClient: a client of IDEM_REDIS_URL
// counting its round trips, and a fresh key prefix deleted at cleanup.
var (
	newRedisClient = harness.NewRedisClient
	openRedis      = harness.OpenRedis
)

var mongoLabel sync.Once

func openMongo(tb testing.TB) (idem.Store, *atomic.Int64) {
	s, _, trips := newMongoStore(tb)
	return s, trips
}

// newMongoStore returns a mongostore on a fresh collection of
// IDEM_MONGO_URI (dropped at cleanup), the collection, and its round trips.
func newMongoStore(tb testing.TB) (*mongostore.Store, *mongo.Collection, *atomic.Int64) {
	tb.Helper()
	uri := requireEnv(tb, "IDEM_MONGO_URI")
	trips := new(atomic.Int64)
	monitor := &event.CommandMonitor{Started: func(context.Context, *event.CommandStartedEvent) { trips.Add(1) }}
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetMonitor(monitor).SetServerSelectionTimeout(5 * time.Second))
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	db := client.Database("idembench")
	var info bson.M
	if err := db.RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info); err != nil {
		tb.Fatalf("mongo at IDEM_MONGO_URI: %v", err)
	}
	mongoLabel.Do(func() {
		// A configuration line of the benchmark format, read by cmd/report.
		if v, ok := info["ferretdbVersion"]; ok {
			fmt.Printf("mongo-server: FerretDB test server (tools/ferretdb; ferretdbVersion %v, reports MongoDB %v)\n", v, info["version"])
		} else {
			fmt.Printf("mongo-server: MongoDB %v\n", info["version"])
		}
	})
	coll := db.Collection(fmt.Sprintf("bench_%s_%d", harness.RunID, harness.Seq()))
	tb.Cleanup(func() {
		_ = coll.Drop(ctx)
		_ = client.Disconnect(ctx)
	})
	s := mongostore.New(coll)
	tb.Cleanup(func() { s.Close() })
	return s, coll, trips
}

// reportTrips reports round trips per op counted since start.
func reportTrips(b *testing.B, trips *atomic.Int64, start int64) {
	if trips != nil {
		b.ReportMetric(float64(trips.Load()-start)/float64(b.N), "roundtrips/op")
	}
}

// The shared store benchmarks, storetest-style: each takes a store and runs
// one operation sequence per op.

// benchAcquireComplete: a first execution, Acquire then Complete of a new key.
func benchAcquireComplete(b *testing.B, s idem.Store, trips *atomic.Int64) {
	ctx := context.Background()
	start := count(trips)
	b.ReportAllocs()
	for b.Loop() {
		key, tok := storetest.Key(), storetest.Token()
		if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
			b.Fatalf("Acquire = %v, %v", ok, err)
		}
		if err := s.Complete(ctx, key, tok, benchResponse, benchRetention); err != nil {
			b.Fatal(err)
		}
	}
	reportTrips(b, trips, start)
}

// completed returns a key completed with benchResponse.
func completed(b *testing.B, s idem.Store) string {
	ctx := context.Background()
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
		b.Fatalf("Acquire = %v, %v", ok, err)
	}
	if err := s.Complete(ctx, key, tok, benchResponse, benchRetention); err != nil {
		b.Fatal(err)
	}
	return key
}

// benchReplay: a duplicate of a completed request, one Acquire returning
// the stored response.
func benchReplay(b *testing.B, s idem.Store, trips *atomic.Int64) {
	key := completed(b, s)
	ctx := context.Background()
	start := count(trips)
	b.ReportAllocs()
	for b.Loop() {
		rec, ok, err := s.Acquire(ctx, key, "other", "fp", time.Minute)
		if err != nil || ok || rec.Response == nil {
			b.Fatalf("replay Acquire = %+v, %v, %v", rec, ok, err)
		}
	}
	reportTrips(b, trips, start)
}

// benchHotKey: every goroutine (b.RunParallel) replays the same completed
// key at once: one hot, contended key.
func benchHotKey(b *testing.B, s idem.Store, trips *atomic.Int64) {
	key := completed(b, s)
	start := count(trips)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			rec, ok, err := s.Acquire(ctx, key, "other", "fp", time.Minute)
			if err != nil || ok || rec.Response == nil {
				b.Errorf("hot Acquire = %+v, %v, %v", rec, ok, err)
				return
			}
		}
	})
	reportTrips(b, trips, start)
}

// benchParallelDistinct: first executions of distinct keys from every
// goroutine (b.RunParallel) sharing the store.
func benchParallelDistinct(b *testing.B, s idem.Store, trips *atomic.Int64) {
	start := count(trips)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			key, tok := storetest.Key(), storetest.Token()
			if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
				b.Errorf("Acquire = %v, %v", ok, err)
				return
			}
			if err := s.Complete(ctx, key, tok, benchResponse, benchRetention); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportTrips(b, trips, start)
}

func count(trips *atomic.Int64) int64 {
	if trips == nil {
		return 0
	}
	return trips.Load()
}

// BenchmarkStore runs the shared store benchmarks on every store.
func BenchmarkStore(b *testing.B) {
	ops := []struct {
		name string
		fn   func(*testing.B, idem.Store, *atomic.Int64)
	}{
		{"acquire-complete", benchAcquireComplete},
		{"replay", benchReplay},
		{"hot-key", benchHotKey},
		{"parallel-distinct", benchParallelDistinct},
	}
	for _, sc := range storeCases {
		b.Run("store="+sc.name, func(b *testing.B) {
			for _, op := range ops {
				b.Run("op="+op.name, func(b *testing.B) {
					s, trips := sc.open(b)
					warm(b, s)
					op.fn(b, s, trips)
				})
			}
		})
	}
}

// warm runs one acquire, complete and replay so that one-time costs (Redis
// script loading, MongoDB clock reading and connection set-up) stay out of
// the measurement and the round-trip counts.
func warm(b *testing.B, s idem.Store) {
	key := completed(b, s)
	if _, _, err := s.Acquire(context.Background(), key, "other", "fp", time.Minute); err != nil {
		b.Fatal(err)
	}
	holder := storetest.Key()
	if _, _, err := s.Acquire(context.Background(), holder, "t", "fp", time.Minute); err != nil {
		b.Fatal(err)
	}
	if err := s.Release(context.Background(), holder, "t"); err != nil {
		b.Fatal(err)
	}
}

// engineRequest is a covered request through the engine (no framework).
func engineRequest(key string) *idem.Request {
	return &idem.Request{Method: http.MethodPost, Route: route, Path: route, ContentType: "application/json",
		Keys: []string{key}, Principal: principal, Body: reqBody}
}

var respHeader = http.Header{"Content-Type": {"application/json"}}

// runEngine runs one request through the engine as an adapter would, and
// returns the status answered.
func runEngine(e *idem.Engine, key string) int {
	x, resp := e.Begin(context.Background(), engineRequest(key))
	if resp != nil {
		return resp.Status
	}
	if x == nil {
		return 0
	}
	_, _ = x.Write(respBody)
	x.Finish(http.StatusCreated, respHeader)
	return http.StatusCreated
}

// BenchmarkEngine measures a request through the engine (Begin, Write,
// Finish) on every store, with its round trips: the floor is 2 for a fresh
// key (acquire, complete), 1 for a replay and 1 for a conflict.
func BenchmarkEngine(b *testing.B) {
	for _, sc := range storeCases {
		b.Run("store="+sc.name, func(b *testing.B) {
			b.Run("path=fresh", func(b *testing.B) {
				s, trips := sc.open(b)
				e := newEngine(b, s)
				warm(b, s)
				start := count(trips)
				b.ReportAllocs()
				for b.Loop() {
					if code := runEngine(e, newKey()); code != http.StatusCreated {
						b.Fatalf("fresh: %s", statusText(code))
					}
				}
				reportTrips(b, trips, start)
			})
			b.Run("path=replay", func(b *testing.B) {
				s, trips := sc.open(b)
				e := newEngine(b, s)
				warm(b, s)
				key := newKey()
				runEngine(e, key)
				start := count(trips)
				b.ReportAllocs()
				for b.Loop() {
					if code := runEngine(e, key); code != http.StatusCreated {
						b.Fatalf("replay: %s", statusText(code))
					}
				}
				reportTrips(b, trips, start)
			})
			b.Run("path=conflict", func(b *testing.B) {
				s, trips := sc.open(b)
				e := newEngine(b, s)
				warm(b, s)
				key := newKey()
				holdKey(b, s, http.MethodPost, route, route, key)
				start := count(trips)
				b.ReportAllocs()
				for b.Loop() {
					if code := runEngine(e, key); code != http.StatusConflict {
						b.Fatalf("conflict: %s", statusText(code))
					}
				}
				reportTrips(b, trips, start)
			})
		})
	}
}

// newEngine is harness.NewEngine: an engine on s with benchRetention.
var newEngine = harness.NewEngine
