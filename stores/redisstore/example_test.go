package redisstore_test

import (
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/redisstore"
)

// Example shares one Redis among every instance of a service. The client is
// the application's own (standalone here; redis.NewFailoverClient for
// Sentinel, redis.NewClusterClient for Cluster work the same way); the store
// borrows it and never closes it.
func Example() {
	client := redis.NewClient(&redis.Options{
		Addr:                  "127.0.0.1:6379",
		ContextTimeoutEnabled: true, // let the engine's store timeout reach the socket
	})
	defer client.Close()

	store := redisstore.New(client,
		redisstore.WithPrefix("payments:idem:"),              // one namespace per service
		redisstore.WithWaitReplicas(1, 100*time.Millisecond), // optional: confirm completions on a replica
	)
	engine, err := idem.New(store, idem.WithRetention(24*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	_ = engine // wrap the HTTP handlers with an adapter, e.g. idemhttp.New(engine)
}
