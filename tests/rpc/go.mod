module github.com/idemkit/idem/tests/rpc

go 1.26.0

require (
	connectrpc.com/connect v1.21.1
	github.com/Shopify/toxiproxy/v2 v2.12.0
	github.com/idemkit/idem/adapters/idemconnect v0.1.0
	github.com/idemkit/idem/adapters/idemgrpc v0.1.0
	github.com/idemkit/idem/adapters/idemhttp v0.1.0
	github.com/idemkit/idem/adapters/idemrpc v0.1.0
	github.com/idemkit/idem/core v0.1.0
	github.com/idemkit/idem/stores/memstore v0.1.0
	github.com/idemkit/idem/stores/pgstore v0.1.0
	github.com/idemkit/idem/stores/redisstore v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/rs/zerolog v1.33.0
	go.uber.org/goleak v1.3.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/gorilla/mux v1.8.1 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.17.11 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_golang v1.21.1 // indirect
	github.com/prometheus/client_model v0.6.1 // indirect
	github.com/prometheus/common v0.62.0 // indirect
	github.com/prometheus/procfs v0.15.1 // indirect
	github.com/rs/xid v1.6.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	gopkg.in/tomb.v1 v1.0.0-20141024135613-dd632973f1e7 // indirect
)

replace (
	github.com/idemkit/idem/adapters/idemconnect => ../../adapters/idemconnect
	github.com/idemkit/idem/adapters/idemgrpc => ../../adapters/idemgrpc
	github.com/idemkit/idem/adapters/idemhttp => ../../adapters/idemhttp
	github.com/idemkit/idem/adapters/idemrpc => ../../adapters/idemrpc
	github.com/idemkit/idem/core => ../../core
	github.com/idemkit/idem/stores/memstore => ../../stores/memstore
	github.com/idemkit/idem/stores/pgstore => ../../stores/pgstore
	github.com/idemkit/idem/stores/redisstore => ../../stores/redisstore
)
