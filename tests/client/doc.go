// Package client tests idemclient end to end: every example service (the six
// frameworks under examples/, each with the memory and the Redis store) runs
// as its own process behind an in-process toxiproxy that resets
// connections, cuts responses after a few bytes and delays replies past the
// client's attempt timeout. Logical payments sent through idemclient are
// executed exactly once each; the same run with a client that retries just
// as often but with a new key per attempt executes more, which shows the
// check can fail. A client process killed between attempts and restarted
// with the same idemclient.Key gets the stored answer replayed.
//
// Executions are counted by the services themselves: the "executions N" line
// each prints when it stops (in-flight handlers finish first) and GET
// /v1/stats. The Redis store needs IDEM_REDIS_URL (scripts/services.sh sets
// it; default redis://127.0.0.1:6379/0); the tests fail without a server.
package client
