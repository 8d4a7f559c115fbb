// Package crash enumerates the engine's crash points: every store call of
// an execution (acquire, lease renewals, completion, release, the
// background completion retry) under every fault of
// core/storetest.FaultStore (the call fails, is delayed, or its reply is
// lost after the store acted), on memstore and on Redis, and checks the
// engine's promises after each: never two executions of one key, a stored
// response is always the handler's, a client gets the handler's answer, a
// 503 or a conflict to retry (never a wrong answer), and no goroutine is
// left behind.
//
// The package holds tests only.
package crash
