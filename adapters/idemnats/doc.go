// Package idemnats makes a NATS JetStream consumer's handler run at most
// once per message key with idem, whatever the redeliveries: a message
// acked too late, a consumer that crashed before its ack, a message
// published twice outside the stream's duplicate window.
//
//	cons, _ := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "receipts", AckPolicy: jetstream.AckExplicitPolicy})
//	cc, _ := cons.Consume(idemnats.Handler(engine, "send-receipt", func(ctx context.Context, msg jetstream.Msg) error {
//		tx, err := pgstore.Tx(ctx) // the outbox row commits with the record
//		if err != nil {
//			return err
//		}
//		return sendReceipt(ctx, tx, msg.Data()) // your effect, written through tx
//	}))
//	defer cc.Stop()
//
// The key is the Nats-Msg-Id header ([WithKey] to change), the scope the
// stream name ([WithScope]), the fingerprint the body ([WithPayload]). The
// handler acks, naks with a delay or terminates each message itself (see
// [Handler]); consumers must use AckExplicitPolicy.
package idemnats
