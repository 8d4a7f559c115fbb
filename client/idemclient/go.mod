module github.com/idemkit/idem/client/idemclient

go 1.25.0

require (
	github.com/google/uuid v1.6.0
	github.com/idemkit/idem/core v0.1.0
	go.uber.org/goleak v1.3.0
)

replace github.com/idemkit/idem/core => ../../core
