// Package chaos proves idem's guarantees across real processes under faults:
// the payments service (examples/payments, -framework nethttp and gin) runs as separate
// processes, several instances share one store (a redis-server or a FerretDB
// server this package starts itself), and an in-process toxiproxy sits
// between each instance and the store to cut, slow down or half-break the
// connection. Instances are SIGKILLed mid-handler and restarted under load.
//
// Executions are counted from the outside only: GET /v1/stats of each
// instance, the "executions N" line an instance prints when it stops, and
// the payment ids clients receive.
//
// TestSentinelFailover runs the instances on a Redis primary, a replica and
// three sentinels (redis-server --sentinel: Debian's redis-server package
// has it) through go-redis's failover client, and fails the primary over
// under load.
//
// The package holds tests only. `make test` runs the short scenarios
// (about two minutes); `make soak` runs TestSoak for minutes (-soak=3m).
//
// Environment:
//   - IDEM_REDIS_SERVER_BIN: the redis-server binary (default: redis-server on PATH)
//   - IDEM_FERRETDB_BIN: the FerretDB test server built from tools/ferretdb
//     (scripts/services.sh exports it); MongoDB scenarios need it.
//
// Both are required when CI=true; otherwise the scenarios needing a missing
// one are skipped.
package chaos
