package chaos

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// backend is a store server of the test's own, and how services reach it.
type backend struct {
	name string
	// addr is the server's host:port (put a proxy in front of it to inject faults).
	addr string
	// flags returns the service flags that select this store at host:port.
	flags func(hostport string) []string
	// inProgress counts records left in progress, and records in all.
	inProgress func(t testing.TB) (stuck, total int)
	// recovery bounds how long clients may take to find the server again
	// after an outage.
	recovery time.Duration
}

func redisBackend(t *testing.T) backend {
	r := startRedis(t)
	return backend{
		name: "redis",
		addr: r.Addr(),
		flags: func(hp string) []string {
			return []string{"-store", "redis", "-redis-url", "redis://" + hp + "/0"}
		},
		inProgress: func(t testing.TB) (int, int) {
			t.Helper()
			stuck, total, err := r.inProgress(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return len(stuck), total
		},
		recovery: 5 * time.Second,
	}
}

func mongoBackend(t *testing.T) backend {
	f := startFerret(t)
	c, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + f.Addr + "/").SetServerSelectionTimeout(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	coll := c.Database("idem").Collection("idempotency") // the examples' names (store.go)
	return backend{
		name: "mongo",
		addr: f.Addr,
		flags: func(hp string) []string {
			return []string{"-store", "mongo", "-mongo-uri", "mongodb://" + hp + "/"}
		},
		inProgress: func(t testing.TB) (int, int) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// An in-progress record whose lease lapsed is expired, not stuck.
			stuck, err := coll.CountDocuments(ctx, bson.D{{Key: "state", Value: 1}, {Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: time.Now()}}}})
			if err != nil {
				t.Fatal(err)
			}
			total, err := coll.CountDocuments(ctx, bson.D{})
			if err != nil {
				t.Fatal(err)
			}
			return int(stuck), int(total)
		},
		// The Go driver finds a server again on its heartbeat (10s by
		// default) or on the next operation's server selection.
		recovery: 20 * time.Second,
	}
}

// backends returns the stores a scenario runs on, each as a constructor.
var backends = []struct {
	name string
	make func(*testing.T) backend
}{
	{"redis", redisBackend},
	{"mongo", mongoBackend},
	{"mysql", mysqlBackend},
}
