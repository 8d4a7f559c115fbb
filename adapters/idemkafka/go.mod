module github.com/idemkit/idem/adapters/idemkafka

go 1.26.0

require (
	github.com/idemkit/idem/core v0.1.0
	github.com/idemkit/idem/outbox v0.1.0
	github.com/twmb/franz-go v1.22.3
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
)

replace (
	github.com/idemkit/idem/core => ../../core
	github.com/idemkit/idem/outbox => ../../outbox
)
