package docs

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/adapters/idemamqp"
	"github.com/idemkit/idem/adapters/idemkafka"
	"github.com/idemkit/idem/adapters/idemnats"
	"github.com/idemkit/idem/stores/pgstore"
)

// sendReceipt is the consumers' effect in their doc comments.
func sendReceipt(ctx context.Context, tx pgx.Tx, body []byte) error { return nil }

func idemnatsDoc() {
	var stream jetstream.Stream
	// doc: adapters/idemnats/doc.go
	cons, _ := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "receipts", AckPolicy: jetstream.AckExplicitPolicy})
	cc, _ := cons.Consume(idemnats.Handler(engine, "send-receipt", func(ctx context.Context, msg jetstream.Msg) error {
		tx, err := pgstore.Tx(ctx) // the outbox row commits with the record
		if err != nil {
			return err
		}
		return sendReceipt(ctx, tx, msg.Data()) // your effect, written through tx
	}))
	defer cc.Stop()
	// doc end
}

func idemamqpDoc() {
	var ch *amqp.Channel
	// doc: adapters/idemamqp/doc.go
	deliveries, _ := ch.Consume("payments", "", false, false, false, false, nil) // autoAck false
	handle := idemamqp.Handler(engine, "send-receipt", func(ctx context.Context, d amqp.Delivery) error {
		tx, err := pgstore.Tx(ctx) // the outbox row commits with the record
		if err != nil {
			return err
		}
		return sendReceipt(ctx, tx, d.Body) // your effect, written through tx
	})
	for d := range deliveries {
		handle(ctx, d)
	}
	// doc end
}

func idemkafkaDoc() {
	var addr string
	// doc: adapters/idemkafka/doc.go
	c := idemkafka.NewConsumer(engine, "send-receipt", func(ctx context.Context, r *kgo.Record) error {
		tx, err := pgstore.Tx(ctx) // the effect commits with the record
		if err != nil {
			return err
		}
		return sendReceipt(ctx, tx, r.Value) // your effect, written through tx
	})
	cl, _ := kgo.NewClient(append(c.ClientOpts(), kgo.SeedBrokers(addr), kgo.ConsumerGroup("receipts"), kgo.ConsumeTopics("payments"))...)
	defer cl.Close()
	c.Run(ctx, cl)
	// doc end
}
