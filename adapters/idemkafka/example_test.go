package idemkafka_test

import (
	"context"
	"log"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/adapters/idemkafka"
	idem "github.com/idemkit/idem/core"
)

// A group consumer whose handler runs once per record key; the store is
// any idem.Store shared by every instance (pgstore for effects committed
// with the record).
func Example() {
	var store idem.Store // e.g. pgstore.New(pool)
	engine, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	c := idemkafka.NewConsumer(engine, "send-receipt", func(ctx context.Context, r *kgo.Record) error {
		return sendReceipt(ctx, r.Value) // once per key; the offset is committed after its record is completed
	})
	cl, err := kgo.NewClient(append(c.ClientOpts(),
		kgo.SeedBrokers("127.0.0.1:9092"), kgo.ConsumerGroup("receipts"), kgo.ConsumeTopics("payments"))...)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	c.Run(context.Background(), cl) // until the context is done
}

func sendReceipt(context.Context, []byte) error { return nil }
