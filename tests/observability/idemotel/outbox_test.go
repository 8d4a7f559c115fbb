package idemotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/observability/idemotel"
	"github.com/idemkit/idem/outbox"
)

// TestOutboxObserver records two publishes, a failure and a pending
// report, and reads them back from the SDK.
func TestOutboxObserver(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	obs, err := idemotel.NewOutboxObserver(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := outbox.Message{ID: "payment.created:1", Subject: "payment.created"}
	obs.Published(ctx, m, 20*time.Millisecond)
	obs.Published(ctx, m, 3*time.Second)
	obs.PublishFailed(ctx, m, errors.New("nats: timeout"))
	obs.Pending(ctx, 42, 1500*time.Millisecond)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	if m, ok := find(rm, idemotel.OutboxLagName); !ok {
		t.Error("no lag histogram")
	} else if dp := m.Data.(metricdata.Histogram[float64]).DataPoints; len(dp) != 1 || dp[0].Count != 2 || dp[0].Sum < 3.02 || dp[0].Sum > 3.021 {
		t.Errorf("lag histogram %+v, want 2 values summing to 3.02s", dp)
	}
	if m, ok := find(rm, idemotel.OutboxPublishedName); !ok || m.Data.(metricdata.Sum[int64]).DataPoints[0].Value != 2 {
		t.Errorf("published counter %+v, want 2", m.Data)
	}
	if m, ok := find(rm, idemotel.OutboxPublishErrorName); !ok || m.Data.(metricdata.Sum[int64]).DataPoints[0].Value != 1 {
		t.Errorf("publish errors %+v, want 1", m.Data)
	}
	if m, ok := find(rm, idemotel.OutboxPendingName); !ok || m.Data.(metricdata.Gauge[int64]).DataPoints[0].Value != 42 {
		t.Errorf("pending gauge %+v, want 42", m.Data)
	}
	if m, ok := find(rm, idemotel.OutboxPendingAgeName); !ok || m.Data.(metricdata.Gauge[float64]).DataPoints[0].Value != 1.5 {
		t.Errorf("pending age gauge %+v, want 1.5", m.Data)
	}
}

// TestTraceContextThroughHeaders injects a span's context into message
// headers, as outbox.WithHeaders does at enqueue, and extracts it as a
// consumer does: the consumer's span continues the handler's trace.
func TestTraceContextThroughHeaders(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("handler").Start(context.Background(), "POST /payments")
	defer span.End()
	headers := map[string]string{}
	idemotel.InjectTraceContext(ctx, headers)
	if headers["traceparent"] == "" {
		t.Fatalf("no traceparent in %v", headers)
	}
	got := trace.SpanContextFromContext(idemotel.ExtractTraceContext(context.Background(), func(k string) string { return headers[k] }))
	if got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() || !got.IsRemote() {
		t.Fatalf("extracted %v, want the handler's span %v", got, span.SpanContext())
	}
}
