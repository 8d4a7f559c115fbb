package idemnats_test

import (
	"context"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/adapters/idemnats"
	idem "github.com/idemkit/idem/core"
)

// A durable consumer whose handler runs once per Nats-Msg-Id; the store is
// any idem.Store shared by every instance (pgstore for effects committed
// with the record).
func Example() {
	var store idem.Store // e.g. pgstore.New(pool)
	engine, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := js.CreateOrUpdateConsumer(ctx, "PAYMENTS", jetstream.ConsumerConfig{Durable: "receipts", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := cons.Consume(idemnats.Handler(engine, "send-receipt", func(ctx context.Context, msg jetstream.Msg) error {
		return sendReceipt(ctx, msg.Data()) // once per message id, acked after its record is completed
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()
}

func sendReceipt(context.Context, []byte) error { return nil }
