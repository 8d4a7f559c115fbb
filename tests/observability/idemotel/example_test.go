package idemotel_test

import (
	"context"
	"fmt"
	"log"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemotel"
	"github.com/idemkit/idem/stores/memstore"
)

// Example counts the decisions of an engine: a request executed, then its
// retry replayed. In a service the meter provider has a real reader, e.g.
// the Prometheus exporter behind /metrics.
func Example() {
	reader := sdkmetric.NewManualReader()
	hook, err := idemotel.NewEventHook(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		log.Fatal(err)
	}
	store := memstore.New()
	defer store.Close()
	engine, err := idem.New(store, idem.WithEventHook(hook))
	if err != nil {
		log.Fatal(err)
	}
	defer engine.Close(context.Background())

	for range 2 { // a request and its retry
		req := &idem.Request{Method: "POST", Route: "/v1/payments", Path: "/v1/payments", Keys: []string{"8e03978e"}, Principal: "acct_1"}
		if x, _ := engine.Begin(context.Background(), req); x != nil {
			x.Finish(201, nil) // the handler's answer
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	counts := map[string]int64{}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name == idemotel.DecisionsName {
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value(idemotel.OutcomeKey)
				counts[v.AsString()] += dp.Value
			}
		}
	}
	fmt.Println(counts)
	// Output: map[acquired:1 completed:1 replayed:1]
}
