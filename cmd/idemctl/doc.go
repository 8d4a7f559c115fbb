// Command idemctl is an operator's tool for incidents with idempotency
// records ("my payment is stuck"), on every shared store: redisstore,
// mongostore, pgstore and mysqlstore (stores implementing idem.Inspector,
// and idem.Lister for list and key prefixes).
//
//	idemctl list  -store ADDR [-state in-progress|uncertain|completed|all] [-limit 20] [-cursor C] [-lease 30s] [KEY-PREFIX]
//	idemctl show  -store ADDR [-body] [-lease 30s] KEY | -principal P -route R -key K [-method POST]
//	idemctl evict -store ADDR [-yes] KEY | -principal P -route R -key K [-method POST]
//	idemctl release|complete -store ADDR ... (uncertain records)
//	idemctl resolve-step -store ADDR -step S (-result FILE | -not-done) [-yes] KEY | -principal P -route R -key K [-method POST]
//	idemctl serve -store ADDR [-addr 127.0.0.1:8080] [-token TOKEN] (the operator's console, observability/idemui)
//
// Install it from a checkout of the repository (the go.work at its root
// takes the checkout's modules):
//
//	go install ./cmd/idemctl              # from the repository root
//	cd cmd/idemctl && go install .        # or from this folder (its replace directives name the checkout)
//
// ADDR is the address the service itself is given, in the form its driver
// takes: a go-sql-driver DSN (root@tcp(127.0.0.1:3306)/payments, as the
// examples' -mysql-dsn) or mysql://user:password@host:port/database; a pgx
// URL (postgres://app@127.0.0.1:5432/payments, postgresql://) or
// keyword/value DSN ("host=127.0.0.1 user=app dbname=payments"); a Redis
// URL (redis://, rediss://; with a master_name parameter, Sentinel
// addresses, as the examples' -redis-url); a MongoDB URI (mongodb://,
// mongodb+srv://).
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
// found, idemctl says on stderr which layout it searched, and names the
// flag only when it checked that the layout is not the service's: the
// table or collection does not exist, or no Redis key has the prefix. On
// Redis it also says when the server's maxmemory-policy can evict records
// (redisstore.Store.Eviction).
//
//	idemctl list  -store redis://127.0.0.1:6379/0 -prefix payments:idem: -state in-progress
//	idemctl show  -store postgres://app@127.0.0.1:5432/payments key=20749a9e2ab7c3dd
//	idemctl show  -store 'root@tcp(127.0.0.1:3306)/payments' -body 20749a9e2ab7c3dd > body.json
//	idemctl evict -store mongodb://127.0.0.1:27017/ -collection payments.idempotency -principal acct_1 -route /v1/payments -key 8e03978e
//
// list prints one line per record: scoped key, state, and for in-progress
// records whether the lease is held and renewed, held but no longer
// renewed, or lapsed and due (its holder stopped renewing, or an
// operator resolved a step: the next request, or a recoverer, takes it
// over and resumes from its journal; SQL and MongoDB keep such records
// until purged, Redis expires them), for uncertain ones what resolves them, for completed ones the
// retention left, and the lease owner. With no record it prints one line,
// "no records" and what it checked of the layout, and exits 0. It cannot show the route: stores keep only the hashed
// scoped key. It shows soonest expiry first, -limit records at a time, and
// prints the -cursor of the next page; on Redis it uses SCAN with COUNT,
// never KEYS, and a page may end early with a cursor after a bounded scan.
//
// The lease owner is the host and process id in the holder's token (an
// engine's tokens are "host:pid:random.counter", idem.TokenOwner). Whether
// the holder still renews its lease is read from the time left: an engine
// writes a full lease every lease/3, so a renewing holder keeps more than
// lease - lease/3 - 2 × store timeout (16s under the default 30s lease and
// 2s store timeout; -lease and -store-timeout name the service's). At or
// below that, the holder stopped (crashed or stalls) and the lease lapses
// in the time left; above it, the holder renews, or took the lease less
// than a renewal period ago: show again later to tell.
//
// show prints the scoped key, the store key it read (Redis key with its
// prefix, SQL table and key, MongoDB collection and _id), state, time to
// live, lease owner and whether its holder renews, fingerprint, for
// completed records the stored status, header lines and body (its size
// and its first 2 KiB, as text when it is text, else Go-quoted), and every
// step of the record's journal (idem.Step) in the order they started: done
// with its result decoded (idem.DecodeStep: the value as the step's codec
// encoded it, JSON by default, first 512 bytes; or its permanent error),
// or started and not done, with the host and process that started it. A
// lapsed lease is shown lapsed and due, not as a negative time to live.
// For an uncertain record a "next" line names the command that resolves
// it: resolve-step for a step started and not done (release deletes the
// journal, so the retry would run that step again), else release or
// complete; and the section of the operator's runbook
// (docs/runbook.md) on what to check first.
//
// -principal, -method, -route and -key name a request's record: -method
// is upper-cased for HTTP (post is POST) and taken as given otherwise, so
// -method '(do)' with the operation's name as -route names an idem.Do or
// consumer record. With -body it writes the stored body, byte for byte, to stdout, and the
// record to stderr.
//
// resolve-step settles one step whose outcome is unknown: its holder
// stopped inside a step that is not idem.Repeatable, so the record is
// uncertain (retries get 409 operation-uncertain) or in progress with its
// lease lapsed. Ask the step's downstream what happened, then: with
// -result FILE the step did happen, and FILE ("-": stdin, with -yes) holds
// its result as the step's codec encodes it (for the default JSON codec,
// the JSON of the value the step's function returns: {"id":"ch_1"}, or
// null for a zero value; at most idem.MaxStepBytes - 1 bytes, checked for
// nothing else); with -not-done it did not happen. After a confirmation
// (or -yes) one atomic idem.ResolveStep marks the step done with the
// result, or removes it, and leaves the record in progress with its lease
// lapsed: the next retry (or a recoverer) takes it over and resumes the
// handler, so steps before it replay, the resolved step returns the
// result without running (or runs, when not done), and the handler's work
// after it happens once. The store must implement idem.StepResolver (the
// four shared stores do).
//
// evict deletes only the record it showed: one that completed or changed
// owner meanwhile is left alone. Evict an in-progress record only when its
// handler is known not to run any more (its process crashed or hangs): a
// running handler renews its lease, and after eviction a retry executes the
// request a second time. Exit status: 0 listed, shown, evicted or
// resolved; 1 no record, an ambiguous prefix, not evicted or resolved, or
// a store error; 2 usage error.
package main
