module github.com/idemkit/idem/tools/history

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/idemkit/idem/core v0.1.0
	github.com/idemkit/idem/stores/memstore v0.1.0
	github.com/idemkit/idem/stores/mongostore v0.1.0
	github.com/idemkit/idem/stores/mysqlstore v0.1.0
	github.com/idemkit/idem/stores/pgstore v0.1.0
	github.com/idemkit/idem/stores/redisstore v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
	go.mongodb.org/mongo-driver/v2 v2.10.0
)

replace (
	github.com/idemkit/idem/core => ../../core
	github.com/idemkit/idem/stores/memstore => ../../stores/memstore
	github.com/idemkit/idem/stores/mongostore => ../../stores/mongostore
	github.com/idemkit/idem/stores/mysqlstore => ../../stores/mysqlstore
	github.com/idemkit/idem/stores/pgstore => ../../stores/pgstore
	github.com/idemkit/idem/stores/redisstore => ../../stores/redisstore
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/xdg-go/scram v1.4.0 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	github.com/youmark/pkcs8 v0.0.0-20240726163527-a2c0da244d78 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)
