// Package outbox publishes a handler's messages exactly when its SQL
// transaction commits: the transactional outbox. [Outbox.Enqueue] writes
// the messages into an outbox table inside the handler's transaction (the
// execution's, pgstore.Tx or mysqlstore.Tx, or the caller's own *sql.Tx or
// pgx.Tx), so they commit or roll back with the business rows and idem's
// record; a [Relay] then publishes the committed ones through a
// [Publisher] (idemnats.Publisher for NATS JetStream, idemamqp.Publisher
// for RabbitMQ, idemkafka.Publisher for Kafka; all three pipeline,
// [BatchPublisher]) and marks them sent. The
// module depends on no driver and no broker client.
//
//	ob, _ := outbox.New(outbox.PostgreSQL, outbox.WithTable("payments_outbox"))
//	_ = ob.EnsureSchema(ctx, db) // db: *sql.DB
//	// in the handler, inside idem:
//	tx, _ := pgstore.Tx(ctx)
//	_ = ob.Enqueue(ctx, outbox.Pgx(tx), outbox.Message{ID: "payment.created:" + p.ID, Key: p.ID, Subject: "payment.created", Payload: body})
//	// in one or more relay processes:
//	relay, _ := outbox.NewRelay(db, ob, idemnats.NewPublisher(js))
//	go relay.Run(ctx)
//
// # Delivery
//
// A message is published at least once, and in enqueue order among the
// messages of its ordering key ([Message.Key]). The relay marks it sent in
// the transaction that claimed it; a relay that dies after the broker
// confirmed a message and before that commit leaves it unsent, and the
// next claim publishes it again with the same [Message.ID]. JetStream
// drops that copy by its Nats-Msg-Id within the stream's duplicate window
// (2 minutes by default); past the window, and always on RabbitMQ, the copy
// is delivered and idem's consumer helpers (idemnats.Handler,
// idemamqp.Handler) run its handler at most once by the same id, for the
// engine's retention. Exactly-once effects therefore need both halves: this
// package on the producing side, idem on the consuming side.
//
// # Several relays
//
// Messages are spread over partitions by a hash of their ordering key
// ([WithPartitions], 16 by default); a relay claims one partition at a
// time with SELECT ... FOR UPDATE SKIP LOCKED on the partitions table (on
// MySQL and MariaDB, which lock every row a locking read scans: a read of
// the candidates without locks, then the first free one locked by primary
// key) and holds that row lock, in one transaction, while it publishes the
// partition's oldest unsent messages and marks them sent. Any number of
// relays (and [WithWorkers] per relay) therefore never publish one message
// at the same time, and keep per-key order; a relay whose database
// connection dies loses its lock with it (the server rolls back), and its
// messages are claimed again.
package outbox
