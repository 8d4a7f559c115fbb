// Package idemotel reports what an idem [idem.Engine] decides as
// OpenTelemetry metrics and span data. It is an event hook, named and shaped
// like the OpenTelemetry Go contrib instrumentations:
//
//	hook, err := idemotel.NewEventHook(idemotel.WithMeterProvider(mp))
//	engine, err := idem.New(store, idem.WithEventHook(hook))
//
// Metrics (names and units follow the OpenTelemetry semantic-convention
// naming rules; the Prometheus exporter shows them as idem_decisions_total,
// idem_store_operation_duration_seconds, idem_handler_duration_seconds and
// idem_execution_active):
//
//   - idem.decisions (Counter, {decision}): every event, by idem.outcome
//     (the [idem.EventKind] values: acquired, replayed, conflict,
//     mismatch, rejected, completed, released, lease-lost, store-error,
//     unprotected, replay-forbidden, fingerprint-changed, uncertain,
//     key-expired, takeover: alert on takeover, the count of lapsed leases
//     taken over after their holder crashed or stalled), http.request.method
//     and http.route;
//   - idem.store.operation.duration (Histogram, s): store calls by
//     idem.store.operation (acquire, complete, release, extend, suspend), with
//     error.type when the store failed;
//   - idem.handler.duration (Histogram, s): how long handlers ran, by method,
//     route and the outcome that ended the execution;
//   - idem.execution.active (UpDownCounter, {execution}): executions holding
//     a lease in this process, by method and route;
//   - idem.recovery.passes (Counter, {pass}), idem.recovery.due,
//     idem.recovery.claimed, idem.recovery.recovered, idem.recovery.deferred
//     and idem.recovery.parked (Counters, {record}): what an
//     [idem.Recoverer]'s passes did ([idem.EventRecoveryPass]): due records
//     seen, claimed, run to a stored answer, deferred, parked uncertain.
//     Due growing faster than claimed, or idem.recovery.due.age (Gauge, s:
//     how long the oldest record the last pass claimed had been due) well
//     above the recovery interval, is a recoverer that cannot keep up; a
//     record whose claims keep failing is logged as a warning.
//
// Attributes never carry the raw idempotency key nor the principal; http.route
// is left out when the adapter reported no route template (the path would be
// unbounded). On the request's active span, each event sets idem.outcome (the
// last one reported while the span is open: an executed request ends with
// completed or released) and idem.scoped_key, the hashed scoped key that
// stores and idemctl show; lease loss and store errors add the span events
// idem.lease_lost and idem.store_error, and a takeover the span event
// idem.takeover (with idem.previous_owner and idem.lapsed).
//
// # The outbox relay
//
// [NewOutboxObserver] returns an outbox.Observer (outbox.WithObserver)
// recording idem.outbox.lag (Histogram, s: enqueue to broker confirm),
// idem.outbox.published (Counter, {message}), idem.outbox.publish.errors
// (Counter, {error}, by error.type), idem.outbox.pending (Gauge, {message})
// and idem.outbox.pending.age (Gauge, s). [InjectTraceContext]
// (outbox.WithHeaders) carries the handler's trace context in each
// message's headers; [ExtractTraceContext] continues it in the consumer.
package idemotel
