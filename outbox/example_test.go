package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log"

	"github.com/idemkit/idem/outbox"
)

// db is the application's database (for PostgreSQL with pgx,
// stdlib.OpenDBFromPool(pool)); publisher is idemnats.NewPublisher(js) or
// idemamqp.NewPublisher(dial, exchange). The example leaves them unset so
// that this module requires no driver or broker client (its tests live in
// tests/outbox).
var (
	db        *sql.DB
	publisher outbox.Publisher
)

// Example enqueues a payment.created event in the transaction that writes
// the payment, and runs a relay.
func Example() {
	ctx := context.Background()
	ob, err := outbox.New(outbox.PostgreSQL, outbox.WithTable("payments_outbox"))
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.EnsureSchema(ctx, db); err != nil {
		log.Fatal(err)
	}

	// In the handler: inside idem, tx is pgstore.Tx(ctx) (pass
	// outbox.Pgx(tx)) or mysqlstore.Tx(ctx).
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO payments (id, amount) VALUES ($1, $2)`, "pay_1", 1000); err != nil {
		log.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"id": "pay_1", "amount": 1000})
	if err := ob.Enqueue(ctx, tx, outbox.Message{ID: "payment.created:pay_1", Key: "pay_1", Subject: "payment.created", Payload: body}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// In one or more relay processes, until ctx is done.
	relay, err := outbox.NewRelay(db, ob, publisher, outbox.WithWorkers(4))
	if err != nil {
		log.Fatal(err)
	}
	_ = relay.Run(ctx)
}
