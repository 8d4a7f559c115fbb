package mongostore_test

import (
	"context"
	"log"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mongostore"
)

// Example wires a store for payments: majority write concern and primary
// reads on the collection, the TTL index, and a purger for servers without
// TTL indexes. It is compile-checked, not run (it needs a server).
func Example() {
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://localhost:27017/"))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = client.Disconnect(context.Background()) }() // the store never closes the client

	coll := client.Database("payments").Collection("idempotency",
		options.Collection().SetWriteConcern(writeconcern.Majority()).SetReadPreference(readpref.Primary()))
	store := mongostore.New(coll)
	defer store.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := store.EnsureIndexes(ctx); err != nil {
		log.Fatal(err)
	}
	if err := store.StartPurger(10 * time.Minute); err != nil { // optional with a TTL index
		log.Fatal(err)
	}

	engine, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	_ = engine // hand it to an adapter, e.g. idemhttp.New(engine)
}
