package idemotel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemkit/idem/outbox"
)

// Instrument names of the outbox relay ([NewOutboxObserver]).
const (
	OutboxLagName          = "idem.outbox.lag"            // Histogram, unit s
	OutboxPublishedName    = "idem.outbox.published"      // Counter, unit {message}
	OutboxPublishErrorName = "idem.outbox.publish.errors" // Counter, unit {error}, attribute error.type
	OutboxPendingName      = "idem.outbox.pending"        // Gauge, unit {message}
	OutboxPendingAgeName   = "idem.outbox.pending.age"    // Gauge, unit s
)

// lagBuckets, in seconds: from a relay keeping up (milliseconds) to one
// backed off behind a broker outage (its 30s maximum backoff and beyond).
var lagBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

type outboxObserver struct {
	lag             metric.Float64Histogram
	published, errs metric.Int64Counter
	pending         metric.Int64Gauge
	pendingAge      metric.Float64Gauge
}

// NewOutboxObserver returns an [outbox.Observer] for [outbox.WithObserver]
// recording the relay's lag (enqueue to broker confirm) as the histogram
// idem.outbox.lag, the messages published and the publish errors (by
// error.type) as counters, and the unsent messages and the age of the
// oldest as the gauges idem.outbox.pending and idem.outbox.pending.age
// (refreshed every outbox.WithPendingInterval; several relays on one
// table report the same values). It returns an error when an instrument
// cannot be created.
func NewOutboxObserver(opts ...Option) (outbox.Observer, error) {
	cfg := config{}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.meterProvider == nil {
		cfg.meterProvider = otel.GetMeterProvider()
	}
	m := cfg.meterProvider.Meter(ScopeName)
	var o outboxObserver
	var err error
	if o.lag, err = m.Float64Histogram(OutboxLagName, metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(lagBuckets...),
		metric.WithDescription("Time from a message's enqueue to its broker confirmation.")); err != nil {
		return nil, err
	}
	if o.published, err = m.Int64Counter(OutboxPublishedName, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox messages published and confirmed by the broker.")); err != nil {
		return nil, err
	}
	if o.errs, err = m.Int64Counter(OutboxPublishErrorName, metric.WithUnit("{error}"),
		metric.WithDescription("Failed publishes of outbox messages, retried with backoff, by error type.")); err != nil {
		return nil, err
	}
	if o.pending, err = m.Int64Gauge(OutboxPendingName, metric.WithUnit("{message}"),
		metric.WithDescription("Committed outbox messages not yet published.")); err != nil {
		return nil, err
	}
	if o.pendingAge, err = m.Float64Gauge(OutboxPendingAgeName, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest committed outbox message not yet published; 0 when none.")); err != nil {
		return nil, err
	}
	return &o, nil
}

func (o *outboxObserver) Published(ctx context.Context, _ outbox.Message, lag time.Duration) {
	o.published.Add(ctx, 1)
	o.lag.Record(ctx, lag.Seconds())
}

func (o *outboxObserver) PublishFailed(ctx context.Context, _ outbox.Message, err error) {
	o.errs.Add(ctx, 1, metric.WithAttributes(semconv.ErrorType(err)))
}

func (o *outboxObserver) Pending(ctx context.Context, messages int64, oldest time.Duration) {
	o.pending.Record(ctx, messages)
	o.pendingAge.Record(ctx, oldest.Seconds())
}

// InjectTraceContext puts the trace context of ctx into headers with the
// global propagator (otel.GetTextMapPropagator(): set it to
// propagation.TraceContext{} for W3C traceparent and tracestate): pass it
// to outbox.WithHeaders, so every message enqueued by a handler carries the
// handler's span. The consumer continues the trace with
// [ExtractTraceContext].
func InjectTraceContext(ctx context.Context, headers map[string]string) {
	otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(headers))
}

// ExtractTraceContext returns ctx with the remote span context that get
// (a message's header lookup, e.g. jetstream.Msg.Headers().Get, or a
// lookup in an AMQP delivery's Headers table) carries, by the global
// propagator; start the consumer's span from it.
func ExtractTraceContext(ctx context.Context, get func(key string) string) context.Context {
	return otel.GetTextMapPropagator().Extract(ctx, getter(get))
}

// getter is a read-only propagation.TextMapCarrier over a lookup function.
type getter func(string) string

func (g getter) Get(key string) string { return g(key) }
func (getter) Set(string, string)      {}
func (getter) Keys() []string          { return nil }
