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
//
// Each section below is for one reader (an application, an adapter author,
// a store author, a consumer of the engine's events) and lists the names
// that reader needs; the others can be skipped.
//
// # Using idem
//
// An application builds one [Engine] with [New] from a store
// (stores/memstore, redisstore, mongostore, pgstore) and options, mounts
// an adapter (adapters/idemhttp, idemgin, idemecho, idemechov5, idemfiber,
// idemfiberv3) built from it, and calls [Engine.Close] after its server
// has shut down.
//
//   - Options: [WithHeader], [WithMethods], [WithLease], [WithRetention],
//     [WithStoreTimeout], [WithMaxBodyBytes], [WithMaxResponseBytes],
//     [WithWait], [WithRetryAfter], [WithCompletionRetry], [WithStoreAll],
//     [WithStorePolicy], [WithStoredHeaders], [WithUnstoredHeaders],
//     [WithFailOpen], [WithGlobalScope], [WithKeyOptional],
//     [WithKeyValidator], [WithProblemRenderer], [WithLogger],
//     [WithEventHook]; per route, [WithRoute] with [RouteLease],
//     [RouteRetention] and [RouteFingerprint].
//   - In a handler: [InfoFromContext] and [Info] (the scoped key, fit to
//     forward as a payment provider's idempotency key; whether the answer is
//     a replay, for middleware outside idem).
//   - Effects outside the store's transaction: [Step] journals each one
//     (options [Repeatable], [StepCodec]; errors [ErrStepUncertain],
//     [ErrNoJournal], [ErrStepTooLarge], [ErrStepName], [ErrTooManySteps]),
//     so that a takeover after a crash resumes after the last finished
//     step; [StepKey] and [DerivedKey] give each step a stable key to
//     forward downstream.
//   - What clients see: [Problem] and [ProblemTypeBase] (RFC 9457 answers),
//     [DefaultHeader], [ReplayedHeader], [MaxKeyLength]; [Outcome] names
//     each of the engine's answers and whether it may be retried.
//   - Operators and tests: [ScopedKey] names the record of one request (as
//     cmd/idemctl does), [Fingerprint] and [ParseKey] (errors
//     [ErrKeyMissing], [ErrKeyMalformed], [ErrKeyTooLong], [ErrKeyConflict])
//     compute what the engine compares and parses.
//
// # Writing an adapter
//
// An adapter translates one framework; it decides nothing. It calls
// [Engine.Covers] first and passes other requests through, refuses a
// missing scope function at construction with [Engine.MustHaveScope], then
// starts each covered request with [Engine.BeginHTTP] (net/http based
// frameworks) or [Engine.Begin] with a [Request] (frameworks with their own
// request type; [Engine.Header] names the key header). An answer ([Response])
// is written with [Response.Send] or [Response.WriteLines] (a [LineWriter]
// such as fasthttp's header). An [Execution] runs the handler: bind
// [Execution.WithInfo] into the handler's context (with [InfoKey] and
// [ContextWithInfo] where the framework keeps its own context values), tell
// it the lines outer middleware set with [Execution.OuterHeader], capture
// with [Execution.Capture] (a [CaptureWriter] and the handler's request
// carrying the Info, in one allocation) or [Execution.Write], and end it
// exactly once: [Execution.Finish],
// [Execution.FinishLines] with [HeaderLines], [Execution.Fail] (an error
// without a response), [Execution.Abort] (a panic), after
// [Execution.SnapshotHeader] or [Execution.Unreplayable] where the
// framework needs them. An adapter for another protocol (gRPC, a client, a
// message consumer) translates the engine's answers by [Outcome]
// ([OutcomeOf] a Response, [OutcomeOfError] an error of [Do],
// [Outcome.ConsumerAction]), never by HTTP status, and iterates [Outcomes]
// in a test. The suite core/adaptertest checks an adapter
// through its real framework; CONTRIBUTING.md says where its tests live.
//
// # Writing a store
//
// A store keeps records for the engine; applications only construct one.
// It implements [Store] (records: [Record], [State]; errors:
// [ErrNotOwner], [ErrInvalidDuration], [ErrTooLarge], [ErrNotDurable],
// [ErrCorrupt]), filling the optional [Record.LeaseLeft] where it is
// cheap, and, where it can, the optional [Extender] (lease renewal),
// [Transactional] with [Unit] (completion inside the store's transaction;
// handlers reach it through [UnitFromContext]), [Inspector] with
// [RecordInfo] and [ErrRecordChanged] and [Lister] with [ListQuery] and
// [ListPage] (cmd/idemctl), [Keeper] with [Keep] (uncertain records and
// tombstones, [StateUncertain] and [StateExpired]), [Journal] with
// [StepEntry] and [SuspendUnit] (the step journal of [Step], takeovers
// reported; limits [MaxSteps], [MaxStepBytes], [MaxStepName]), or
// [LocalStore]. The
// suite core/storetest checks a store against its real server, including
// an outage (storetest.RunOutage) and the journal (storetest.RunJournal).
//
// # Events
//
// [WithEventHook] receives one [Event] per decision and store call:
// [EventKind] (acquired, replayed, conflict, mismatch, rejected, completed,
// released, lease-lost, store-error, unprotected, replay-forbidden,
// fingerprint-changed, uncertain, key-expired, takeover), the [StoreOp] behind it
// and durations, never the raw key or the principal.
// observability/idemotel turns them into OpenTelemetry metrics and span
// data.
package idem
