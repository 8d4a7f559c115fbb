// Command idemctl is an operator's view of one idempotency key: it computes
// the scoped key a store holds for a request (idem.ScopedKey over principal,
// method, route template and the Idempotency-Key value), shows the record
// (state, time to live, lease owner, fingerprint, stored status, header
// lines and body size) and evicts it after a confirmation, so that a retry
// executes again. It works on any store implementing idem.Inspector:
// redisstore, mongostore and mysqlstore.
//
//	idemctl show -store redis://127.0.0.1:6379/0 -principal acct_1 -route /v1/payments -key 8e03978e
//	idemctl evict -store mongodb://127.0.0.1:27017/ -collection idem.idempotency -principal acct_1 -route /v1/payments -key 8e03978e
//	idemctl show -store mysql://root@127.0.0.1:3306/payments -table idem_records -principal acct_1 -route /v1/payments -key 8e03978e
//	idemctl show -store redis://127.0.0.1:6379/0 -scoped-key 5d41...   (the idem.scoped_key of a trace)
//
// Evict deletes only the record it showed: one that completed or changed
// owner meanwhile is left alone. Evict an in-progress record only when its
// handler is known not to run any more (its process crashed or hangs): a
// running handler renews its lease, and after eviction a retry executes the
// request a second time. Exit status: 0 shown or evicted, 1 no record, not
// evicted or store error, 2 usage error.
package main
