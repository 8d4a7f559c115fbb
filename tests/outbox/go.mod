module github.com/idemkit/idem/tests/outbox

go 1.26.0

require (
	github.com/Shopify/toxiproxy/v2 v2.12.0
	github.com/go-sql-driver/mysql v1.10.1
	github.com/idemkit/idem/adapters/idemamqp v0.1.0
	github.com/idemkit/idem/adapters/idemkafka v0.1.0
	github.com/idemkit/idem/adapters/idemnats v0.1.0
	github.com/idemkit/idem/core v0.1.0
	github.com/idemkit/idem/outbox v0.1.0
	github.com/idemkit/idem/stores/mysqlstore v0.1.0
	github.com/idemkit/idem/stores/pgstore v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/nats-io/nats.go v1.55.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/rs/zerolog v1.33.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
	go.uber.org/goleak v1.3.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/gorilla/mux v1.8.1 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-colorable v0.1.13 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/prometheus/client_golang v1.21.1 // indirect
	github.com/prometheus/client_model v0.6.1 // indirect
	github.com/prometheus/common v0.62.0 // indirect
	github.com/prometheus/procfs v0.15.1 // indirect
	github.com/rs/xid v1.5.0 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/protobuf v1.36.1 // indirect
	gopkg.in/tomb.v1 v1.0.0-20141024135613-dd632973f1e7 // indirect
)

replace (
	github.com/idemkit/idem/adapters/idemamqp => ../../adapters/idemamqp
	github.com/idemkit/idem/adapters/idemkafka => ../../adapters/idemkafka
	github.com/idemkit/idem/adapters/idemnats => ../../adapters/idemnats
	github.com/idemkit/idem/core => ../../core
	github.com/idemkit/idem/outbox => ../../outbox
	github.com/idemkit/idem/stores/mysqlstore => ../../stores/mysqlstore
	github.com/idemkit/idem/stores/pgstore => ../../stores/pgstore
)
