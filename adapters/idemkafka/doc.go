// Package idemkafka makes a Kafka group consumer (franz-go's kgo) run its
// handler at most once per record key with idem, whatever the
// redeliveries: a consumer that died before its offset commit, a
// partition revoked mid-handler, a record produced twice; and publishes
// an outbox's messages to Kafka ([Publisher]).
//
//	c := idemkafka.NewConsumer(engine, "send-receipt", func(ctx context.Context, r *kgo.Record) error {
//		tx, err := pgstore.Tx(ctx) // the effect commits with the record
//		if err != nil {
//			return err
//		}
//		return sendReceipt(ctx, tx, r.Value) // your effect, written through tx
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
//
// # Restarts
//
// A consumer killed or restarted without leaving its group (kill -9, an
// OOM kill, a crash; a clean Close leaves it) keeps its partitions until
// the group's session timeout ends (kgo.SessionTimeout, 45s by default):
// nobody consumes them meanwhile, and the restarted process, a new member,
// waits for that rebalance too. To shorten it, give each process a
// stable kgo.InstanceID (static membership, KIP-345: a member that comes
// back under its ID within the session gets its partitions back without a
// rebalance), or a shorter kgo.SessionTimeout (with kgo.HeartbeatInterval
// well below it; a member that stalls longer than it loses its
// partitions, which idem makes safe but slower). examples/consumer's
// -kafka-session sets both timeouts.
//
// # Dead-letter topic
//
// Parked records are produced to the record's topic plus ".DLT"
// ([WithDeadLetterTopic]). The consumer does not create it: create it
// with the source topic (kadm.Client.CreateTopic, or your provisioning),
// or let the cluster create topics on produce (auto.create.topics.enable
// on the brokers, kgo.AllowAutoTopicCreation on the client). A park to a
// missing topic fails and is retried in place: the partition's offset
// stays uncommitted and the records after it wait until the topic exists.
package idemkafka
