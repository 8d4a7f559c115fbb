// Package idem makes mutating HTTP endpoints safe to retry: each request
// carrying an Idempotency-Key executes at most once per scope, and every
// duplicate gets the stored response back.
//
// The [Engine] holds the policy (key parsing, scope, fingerprint, lease,
// what is stored, problem responses) and a [Store] holds the records, one
// atomic operation per state transition: absent → in-progress → completed →
// expired. Adapters for net/http, Gin, Echo and Fiber translate their
// framework's request and response to the engine and decide nothing.
//
// The rules follow the IETF draft "The Idempotency-Key HTTP Header Field"
// (draft-ietf-httpapi-idempotency-key-header) and Stripe's documented
// behaviour; errors are RFC 9457 problem details.
//
// Jobs and message consumers use the same engine and stores through [Do]:
// a function runs at most once per (scope, operation name, key), and
// duplicates get its stored result (adapters/idemnats and
// adapters/idemamqp wrap broker message handlers with it).
//
// Import it as:
//
//	import idem "github.com/idemkit/idem/core"
package idem
