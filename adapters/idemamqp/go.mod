module github.com/idemkit/idem/adapters/idemamqp

go 1.25.0

require (
	github.com/idemkit/idem/core v0.1.0
	github.com/idemkit/idem/stores/memstore v0.1.0
	github.com/rabbitmq/amqp091-go v1.16.0
	go.uber.org/goleak v1.3.0
)

replace github.com/idemkit/idem/core => ../../core

replace github.com/idemkit/idem/stores/memstore => ../../stores/memstore
