module github.com/idemkit/idem/tests/mcp

go 1.26.0

require (
	github.com/idemkit/idem/adapters/idemmcp v0.1.0
	github.com/idemkit/idem/core v0.1.0
	github.com/idemkit/idem/stores/memstore v0.1.0
	github.com/idemkit/idem/stores/pgstore v0.1.0
	github.com/idemkit/idem/stores/redisstore v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/modelcontextprotocol/go-sdk v1.8.0
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/jsonschema-go v0.4.3 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/segmentio/asm v1.1.3 // indirect
	github.com/segmentio/encoding v0.5.4 // indirect
	github.com/yosida95/uritemplate/v3 v3.0.2 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/oauth2 v0.35.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	golang.org/x/time v0.15.0 // indirect
)

replace (
	github.com/idemkit/idem/adapters/idemmcp => ../../adapters/idemmcp
	github.com/idemkit/idem/core => ../../core
	github.com/idemkit/idem/stores/memstore => ../../stores/memstore
	github.com/idemkit/idem/stores/pgstore => ../../stores/pgstore
	github.com/idemkit/idem/stores/redisstore => ../../stores/redisstore
)
