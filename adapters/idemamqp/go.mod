module github.com/idemkit/idem/adapters/idemamqp

go 1.25.0

require (
	github.com/idemkit/idem/core v0.1.0
	github.com/rabbitmq/amqp091-go v1.16.0
)

replace github.com/idemkit/idem/core => ../../core
