// Package outboxtest proves the transactional outbox (module outbox)
// end to end, on real servers: PostgreSQL and MariaDB hold the outbox,
// relays publish to NATS JetStream (a single node, and a 3-node cluster
// started here with an R3 stream), RabbitMQ and Kafka (kfake, franz-go's
// Kafka, in the test process), and idem's consumer helpers apply each
// message's effect. Handler and relay processes (this test binary,
// re-executed) are SIGKILLed at the named points; broker nodes are killed
// and restarted, stream leaders and partitions moved. Every committed
// message must yield exactly one effect, no rolled-back one any.
//
// It is a module of its own so that the outbox module keeps no broker or
// driver dependency. `go test` plays a short seeded run; -soak plays the
// long cluster run and the 10,000-message load on each broker (make soak).
package outboxtest
