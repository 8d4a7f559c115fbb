// Package idemkafka makes a Kafka group consumer (franz-go's kgo) run its
// handler at most once per record key with idem, whatever the
// redeliveries: a consumer that died before its offset commit, a
// partition revoked mid-handler, a record produced twice; and publishes
// an outbox's messages to Kafka ([Publisher]).
//
//	c := idemkafka.NewConsumer(engine, "send-receipt", func(ctx context.Context, r *kgo.Record) error {
//		tx, err := pgstore.Tx(ctx) // the effect commits with the record
//		...
//	})
//	cl, _ := kgo.NewClient(append(c.ClientOpts(), kgo.SeedBrokers(addr), kgo.ConsumerGroup("receipts"), kgo.ConsumeTopics("payments"))...)
//	defer cl.Close()
//	c.Run(ctx, cl)
//
// The key is the Idempotency-Key header, else the record's
// partition/offset ([WithKey]); the scope the topic ([WithScope]); the
// fingerprint the value ([WithPayload]). Offsets are committed only up
// to the records whose execution completed or that were parked in the
// dead-letter topic, in order per partition (see [NewConsumer]).
package idemkafka
