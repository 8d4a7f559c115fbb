package idemotel_test

import (
	"context"
	"strconv"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemotel"
	"github.com/idemkit/idem/stores/memstore"
)

// BenchmarkHook measures a fresh request and its replay through the engine
// on memstore, without a hook and with idemotel on the SDK (a ManualReader,
// and a recording span in the request context), to give the hook's cost as
// a ratio: benchstat the two sub-benchmarks.
func BenchmarkHook(b *testing.B) {
	b.Run("none", func(b *testing.B) { benchEngine(b, context.Background()) })
	b.Run("idemotel-metrics", func(b *testing.B) {
		hook, err := idemotel.NewEventHook(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))))
		if err != nil {
			b.Fatal(err)
		}
		benchEngine(b, context.Background(), idem.WithEventHook(hook))
	})
	b.Run("idemotel-metrics-span", func(b *testing.B) {
		hook, err := idemotel.NewEventHook(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))))
		if err != nil {
			b.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider()
		defer func() { _ = tp.Shutdown(context.Background()) }()
		ctx, span := tp.Tracer("bench").Start(context.Background(), "request")
		defer span.End()
		benchEngine(b, ctx, idem.WithEventHook(hook))
	})
}

func benchEngine(b *testing.B, ctx context.Context, opts ...idem.Option) {
	store := memstore.New()
	defer store.Close()
	e, err := idem.New(store, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close(context.Background())
	body := []byte(`{"amount":1000,"currency":"eur"}`)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		key := strconv.Itoa(i)
		for range 2 { // fresh, then its replay
			req := idem.Request{Method: "POST", Route: "/v1/payments", Path: "/v1/payments", Keys: []string{key}, Principal: "u1", Body: body}
			if x, _ := e.Begin(ctx, &req); x != nil {
				x.Finish(201, nil)
			}
		}
	}
}
