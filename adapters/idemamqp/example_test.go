package idemamqp_test

import (
	"context"
	"log"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/adapters/idemamqp"
	idem "github.com/idemkit/idem/core"
)

// A consumer whose handler runs once per MessageId; the store is any
// idem.Store shared by every instance (pgstore for effects committed with
// the record).
func Example() {
	var store idem.Store // e.g. pgstore.New(pool)
	engine, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("payments", "", false, false, false, false, nil) // autoAck false
	if err != nil {
		log.Fatal(err)
	}
	handle := idemamqp.Handler(engine, "send-receipt", func(ctx context.Context, d amqp.Delivery) error {
		return sendReceipt(ctx, d.Body) // once per message id, acked after its record is completed
	}, idemamqp.WithScope(func(amqp.Delivery) string { return "payments" }))
	ctx := context.Background()
	for d := range deliveries {
		handle(ctx, d)
	}
}

func sendReceipt(context.Context, []byte) error { return nil }
