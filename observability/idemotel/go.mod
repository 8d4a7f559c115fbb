module github.com/idemkit/idem/observability/idemotel

go 1.26.0

require (
	github.com/idemkit/idem/core v0.1.0
	github.com/idemkit/idem/outbox v0.1.0
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/metric v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
)

require github.com/cenkalti/backoff/v5 v5.0.3 // indirect

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
)

replace (
	github.com/idemkit/idem/core => ../../core
	github.com/idemkit/idem/outbox => ../../outbox
)
