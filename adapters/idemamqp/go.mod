module github.com/idemkit/idem/adapters/idemamqp

go 1.25.0

require (
	github.com/idemkit/idem/core v0.1.0
	github.com/idemkit/idem/outbox v0.1.0
	github.com/rabbitmq/amqp091-go v1.16.0
)

require github.com/cenkalti/backoff/v5 v5.0.3 // indirect

replace (
	github.com/idemkit/idem/core => ../../core
	github.com/idemkit/idem/outbox => ../../outbox
)
