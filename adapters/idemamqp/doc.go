// Package idemamqp makes a RabbitMQ (AMQP 0-9-1) consumer's handler run at
// most once per message key with idem, whatever the redeliveries: a
// consumer that crashed or lost its channel before its ack, a delivery
// whose ack timed out (consumer_timeout), a message published twice.
//
//	deliveries, _ := ch.Consume("payments", "", false, false, false, false, nil) // autoAck false
//	handle := idemamqp.Handler(engine, "send-receipt", func(ctx context.Context, d amqp.Delivery) error {
//		tx, err := pgstore.Tx(ctx) // the outbox row commits with the record
//		if err != nil {
//			return err
//		}
//		return sendReceipt(ctx, tx, d.Body) // your effect, written through tx
//	})
//	for d := range deliveries {
//		handle(ctx, d)
//	}
//
// The key is the MessageId property ([WithKey] to change), the scope ""
// ([WithScope]), the fingerprint the body ([WithPayload]). The handler
// acks, requeues or rejects each delivery itself (see [Handler]).
package idemamqp
