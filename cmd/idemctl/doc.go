// Command idemctl is an operator's tool for incidents with idempotency
// records ("my payment is stuck"), on every shared store: redisstore,
// mongostore, pgstore and mysqlstore (stores implementing idem.Inspector,
// and idem.Lister for list and key prefixes).
//
//	idemctl list  -store URL [-state in-progress|completed|all] [-limit 20] [-cursor C] [KEY-PREFIX]
//	idemctl show  -store URL [-body] KEY | -principal P -route R -key K [-method POST]
//	idemctl evict -store URL [-yes] KEY | -principal P -route R -key K [-method POST]
//
// KEY is the scoped key in any form idem prints: the 16 hex characters a
// log line carries as key= ("key=" may be pasted with them), the 64 of a
// trace's idem.scoped_key, or any prefix of at least 8. A prefix is looked
// up in the store (idem.Lister: Redis SCAN MATCH, an index range in SQL and
// MongoDB); one that matches several records lists them and exits 1. The
// request form computes the scoped key (idem.ScopedKey over principal,
// method, route template and the Idempotency-Key value).
//
// The store's layout flags default to the stores' own defaults: -prefix
// "idem:" (redisstore.WithPrefix), -table "idem_records" (pgstore and
// mysqlstore WithTable; schema.table too), -collection idem.idempotency
// (the collection the service gives mongostore.New). When nothing is
// found, idemctl says on stderr which layout it searched and which flag
// names another.
//
//	idemctl list  -store redis://127.0.0.1:6379/0 -prefix payments:idem: -state in-progress
//	idemctl show  -store postgres://app@127.0.0.1:5432/payments key=20749a9e2ab7c3dd
//	idemctl show  -store mysql://root@127.0.0.1:3306/payments -body 20749a9e2ab7c3dd > body.json
//	idemctl evict -store mongodb://127.0.0.1:27017/ -collection payments.idempotency -principal acct_1 -route /v1/payments -key 8e03978e
//
// list prints one line per record: scoped key, state, and for in-progress
// records whether the lease is held (retries get 409 until it ends) or has
// lapsed (its holder stopped renewing: the next request executes; SQL and
// MongoDB keep such records until purged, Redis expires them with the
// lease), for completed ones the retention left. It shows soonest expiry
// first, -limit records at a time, and prints the -cursor of the next
// page; on Redis it uses SCAN with COUNT, never KEYS, and a page may end
// early with a cursor after a bounded scan.
//
// show prints the scoped key, the store key it read (Redis key with its
// prefix, SQL table and key, MongoDB collection and _id), state, time to
// live, lease owner, fingerprint and, for completed records, the stored
// status, header lines and body size. With -body it writes the stored
// body, byte for byte, to stdout, and the record to stderr.
//
// evict deletes only the record it showed: one that completed or changed
// owner meanwhile is left alone. Evict an in-progress record only when its
// handler is known not to run any more (its process crashed or hangs): a
// running handler renews its lease, and after eviction a retry executes the
// request a second time. Exit status: 0 listed, shown or evicted; 1 no
// record, an ambiguous prefix, not evicted or a store error; 2 usage error.
package main
