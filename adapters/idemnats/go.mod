module github.com/idemkit/idem/adapters/idemnats

go 1.26.0

require (
	github.com/idemkit/idem/core v0.1.0
	github.com/idemkit/idem/outbox v0.1.0
	github.com/nats-io/nats.go v1.55.0
)

require github.com/cenkalti/backoff/v5 v5.0.3 // indirect

require (
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace (
	github.com/idemkit/idem/core => ../../core
	github.com/idemkit/idem/outbox => ../../outbox
)
