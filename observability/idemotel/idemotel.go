package idemotel

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	idem "github.com/idemkit/idem/core"
)

// ScopeName is the instrumentation scope of the meter, the module's import path.
const ScopeName = "github.com/idemkit/idem/observability/idemotel"

// Instrument names (OpenTelemetry semantic-convention naming: dot-separated
// namespace, counters pluralized by their unit, UpDownCounters not).
const (
	DecisionsName       = "idem.decisions"                // Counter, unit {decision}
	StoreDurationName   = "idem.store.operation.duration" // Histogram, unit s
	HandlerDurationName = "idem.handler.duration"         // Histogram, unit s
	ActiveName          = "idem.execution.active"         // UpDownCounter, unit {execution}
)

// Attribute keys of the idem namespace; method, route and error type use the
// semantic-convention keys http.request.method, http.route and error.type.
const (
	// OutcomeKey is the event kind, e.g. "replayed" ([idem.EventKind.String]).
	OutcomeKey = attribute.Key("idem.outcome")
	// ScopedKeyKey is the hashed scoped key, 64 hex characters
	// ([idem.ScopedKey]); spans only, never metrics (unbounded).
	ScopedKeyKey = attribute.Key("idem.scoped_key")
	// StoreOperationKey is the store call: acquire, complete, release,
	// extend or suspend.
	StoreOperationKey = attribute.Key("idem.store.operation")
	// PreviousOwnerKey is, on the idem.takeover span event, the host and
	// process id ("host:pid") whose lapsed lease was taken over.
	PreviousOwnerKey = attribute.Key("idem.previous_owner")
	// LapsedKey is, on the idem.takeover span event, how long the previous
	// lease had lapsed, in seconds.
	LapsedKey = attribute.Key("idem.lapsed")
)

// Span event names.
const (
	LeaseLostEvent  = "idem.lease_lost"
	StoreErrorEvent = "idem.store_error"
	// TakeoverEvent: this request took a lapsed lease over (its holder
	// crashed or stalled) and resumes its execution.
	TakeoverEvent = "idem.takeover"
)

// Bucket boundaries, in seconds: the semantic conventions' advice for
// http.server.request.duration (handlers) and db.client.operation.duration
// (store calls).
var (
	handlerBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	storeBuckets   = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10}
)

// Option configures [NewEventHook].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	meterProvider metric.MeterProvider
}

// WithMeterProvider sets the meter provider the instruments are created
// with. Optional. Default is the global one, otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.meterProvider = mp })
}

type instruments struct {
	decisions metric.Int64Counter
	store     metric.Float64Histogram
	handler   metric.Float64Histogram
	active    metric.Int64UpDownCounter
	recovery  *recoveryInstruments

	storeOps [idem.OpLapsed + 1]metric.MeasurementOption // by idem.StoreOp, for calls that did not fail
	sets     sync.Map                                    // scopeKey → *scopeSets, at most maxCachedScopes
	cached   atomic.Int64
}

// maxCachedScopes bounds the attribute sets kept for reuse (method, route
// and outcome triples); past it they are built per event. Route templates
// are few, so it is reached only when an adapter reports paths as routes.
const maxCachedScopes = 4096

type scopeKey struct {
	method, route string
	kind          idem.EventKind
}

// scopeSets are the measurement options of one method, route and outcome,
// built once: attribute sets cost allocations on every event otherwise.
type scopeSets struct {
	scope, withOutcome metric.MeasurementOption
}

// NewEventHook returns a hook for [idem.WithEventHook] that records every
// event on the instruments listed in the package documentation and on the
// span active in the event's context (trace.SpanFromContext: put the
// tracing middleware, e.g. otelhttp, outside idem). It is safe for
// concurrent use. It returns an error when an instrument cannot be created.
func NewEventHook(opts ...Option) (func(context.Context, idem.Event), error) {
	cfg := config{}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.meterProvider == nil {
		cfg.meterProvider = otel.GetMeterProvider()
	}
	m := cfg.meterProvider.Meter(ScopeName)
	var in instruments
	var err error
	if in.decisions, err = m.Int64Counter(DecisionsName, metric.WithUnit("{decision}"),
		metric.WithDescription("Idempotency decisions and execution outcomes, by outcome.")); err != nil {
		return nil, err
	}
	if in.store, err = m.Float64Histogram(StoreDurationName, metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(storeBuckets...),
		metric.WithDescription("Duration of idempotency store calls, by operation.")); err != nil {
		return nil, err
	}
	if in.handler, err = m.Float64Histogram(HandlerDurationName, metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(handlerBuckets...),
		metric.WithDescription("Duration of handlers executed under an idempotency key.")); err != nil {
		return nil, err
	}
	if in.active, err = m.Int64UpDownCounter(ActiveName, metric.WithUnit("{execution}"),
		metric.WithDescription("Executions holding an idempotency lease in this process.")); err != nil {
		return nil, err
	}
	if in.recovery, err = newRecoveryInstruments(m); err != nil {
		return nil, err
	}
	for op := idem.OpAcquire; op <= idem.OpLapsed; op++ {
		in.storeOps[op] = metric.WithAttributeSet(attribute.NewSet(StoreOperationKey.String(op.String())))
	}
	return in.record, nil
}

// setsFor returns the measurement options of ev's method, route and outcome.
func (in *instruments) setsFor(ev idem.Event) *scopeSets {
	k := scopeKey{ev.Method, ev.Route, ev.Kind}
	if v, ok := in.sets.Load(k); ok {
		return v.(*scopeSets)
	}
	attrs := make([]attribute.KeyValue, 1, 3)
	attrs[0] = semconv.HTTPRequestMethodKey.String(ev.Method)
	if ev.Route != "" {
		attrs = append(attrs, semconv.HTTPRouteKey.String(ev.Route))
	}
	scope := attrs // method and route
	attrs = append(attrs, OutcomeKey.String(ev.Kind.String()))
	s := &scopeSets{scope: metric.WithAttributes(scope...), withOutcome: metric.WithAttributes(attrs...)}
	if in.cached.Load() < maxCachedScopes {
		if _, loaded := in.sets.LoadOrStore(k, s); !loaded {
			in.cached.Add(1)
		}
	}
	return s
}

func (in *instruments) record(ctx context.Context, ev idem.Event) {
	if ev.Kind == idem.EventRecoveryPass { // a recoverer's pass: no decision
		in.recovery.record(ctx, ev.Pass)
		return
	}
	sets := in.setsFor(ev)
	in.decisions.Add(ctx, 1, sets.withOutcome)
	if ev.Kind == idem.EventAcquired {
		in.active.Add(ctx, 1, sets.scope)
	}
	if ev.Ended {
		in.active.Add(ctx, -1, sets.scope)
		in.handler.Record(ctx, ev.HandlerDuration.Seconds(), sets.withOutcome)
	}
	op := StoreOperationKey.String(ev.Op.String())
	switch {
	case ev.Op == 0 || int(ev.Op) >= len(in.storeOps):
	case ev.Kind == idem.EventStoreError:
		in.store.Record(ctx, ev.StoreDuration.Seconds(), metric.WithAttributes(op, semconv.ErrorType(ev.Err)))
	default:
		in.store.Record(ctx, ev.StoreDuration.Seconds(), in.storeOps[ev.Op])
	}
	outcome := OutcomeKey.String(ev.Kind.String())

	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if ev.Key != "" {
		span.SetAttributes(outcome, ScopedKeyKey.String(ev.Key))
	} else {
		span.SetAttributes(outcome)
	}
	switch ev.Kind {
	case idem.EventTakeover:
		owner := "unknown"
		if host, pid, ok := idem.TokenOwner(ev.PreviousOwner); ok {
			owner = host + ":" + strconv.Itoa(pid)
		}
		span.AddEvent(TakeoverEvent, trace.WithAttributes(PreviousOwnerKey.String(owner), LapsedKey.Float64(ev.Lapsed.Seconds())))
	case idem.EventLeaseLost:
		span.AddEvent(LeaseLostEvent, trace.WithAttributes(op))
	case idem.EventStoreError:
		attrs := []attribute.KeyValue{op, semconv.ErrorType(ev.Err)}
		if ev.Err != nil {
			attrs = append(attrs, semconv.ExceptionMessage(ev.Err.Error()))
		}
		span.AddEvent(StoreErrorEvent, trace.WithAttributes(attrs...))
	}
}
