package docs

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mongostore"
)

func mongostoreSetup() {
	_ = func() error {
		// doc: stores/mongostore/README.md
		client, err := mongo.Connect(options.Client().ApplyURI("mongodb://db-1,db-2,db-3/?replicaSet=rs0"))
		if err != nil {
			return err
		}
		defer client.Disconnect(ctx) // the store borrows the client and never closes it

		// Write concern and read preference are yours: for payments, majority writes
		// (an acknowledged lock or response survives a failover) and primary reads.
		coll := client.Database("payments").Collection("idempotency",
			options.Collection().SetWriteConcern(writeconcern.Majority()).SetReadPreference(readpref.Primary()))

		store := mongostore.New(coll) // no I/O
		defer store.Close()           // stops the purger, if started

		// TTL index on expiresAt: the server deletes expired records (about once a minute).
		if err := store.EnsureIndexes(ctx); err != nil {
			return err
		}

		// Needed where TTL indexes are unavailable (FerretDB), with tombstones (it frees their
		// responses when the retention ends), or to free space sooner:
		if err := store.StartPurger(10 * time.Minute); err != nil {
			return err
		}
		// ... or call store.Purge(ctx) from your own scheduler; it returns the number deleted.

		engine, err := idem.New(store)
		// doc end
		_ = engine
		return err
	}
}
