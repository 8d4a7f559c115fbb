module github.com/idemkit/idem/examples/webhooks

go 1.26.0

require (
	github.com/idemkit/idem/adapters/idemwebhook v0.1.0
	github.com/idemkit/idem/core v0.1.0
	github.com/idemkit/idem/stores/memstore v0.1.0
	github.com/idemkit/idem/stores/redisstore v0.1.0
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/standard-webhooks/standard-webhooks/libraries v1.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace (
	github.com/idemkit/idem/adapters/idemwebhook => ../../adapters/idemwebhook
	github.com/idemkit/idem/core => ../../core
	github.com/idemkit/idem/stores/memstore => ../../stores/memstore
	github.com/idemkit/idem/stores/redisstore => ../../stores/redisstore
)
