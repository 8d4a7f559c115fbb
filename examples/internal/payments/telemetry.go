package payments

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// telemetry sets up OpenTelemetry the way a service's main would, as the
// global providers the instrumentations use by default (idemotel, otelhttp):
// metrics through the OpenTelemetry Prometheus exporter, served by the
// returned handler in the Prometheus text format (mount it on GET /metrics,
// outside your authentication), and, with -trace-file, spans written to
// that file as JSON lines (W3C traceparent headers are honoured). For OTLP,
// give sdkmetric.NewMeterProvider an OTLP reader instead. The returned
// function flushes and stops both.
func telemetry(f Config) (metrics http.Handler, shutdown func(), err error) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	otel.SetMeterProvider(meters)
	stops := []func(context.Context) error{meters.Shutdown}
	if f.TraceFile != "" {
		file, err := os.Create(f.TraceFile)
		if err != nil {
			return nil, nil, fmt.Errorf("-trace-file: %w", err)
		}
		spans, err := stdouttrace.New(stdouttrace.WithWriter(file))
		if err != nil {
			return nil, nil, fmt.Errorf("trace exporter: %w", err)
		}
		tracers := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)) // each span is in the file once it ends
		otel.SetTracerProvider(tracers)
		stops = append(stops, tracers.Shutdown, func(context.Context) error { return file.Close() })
	}
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), func() {
		for _, stop := range stops {
			_ = stop(context.Background())
		}
	}, nil
}
