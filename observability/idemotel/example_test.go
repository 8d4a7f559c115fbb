package idemotel_test

import (
	"log"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemotel"
)

// store is the application's [idem.Store]: memstore.New() for one process
// (github.com/idemkit/idem/stores/memstore), redisstore or mongostore for
// several instances. The example leaves it unset so that this module does not
// require a store module or the OpenTelemetry SDK (its tests, and a runnable
// example reading the metrics back, live in tests/observability/idemotel).
var store idem.Store

// Example records an engine's decisions on the global meter provider, which
// the application sets up with the OpenTelemetry SDK and an exporter
// (otel.SetMeterProvider); put the tracing middleware (e.g. otelhttp)
// outside idem so that events reach its span.
func Example() {
	hook, err := idemotel.NewEventHook()
	if err != nil {
		log.Fatal(err)
	}
	engine, err := idem.New(store, idem.WithEventHook(hook))
	if err != nil {
		log.Fatal(err)
	}
	_ = engine // idemhttp.New(engine, ...) and the other adapters take it
}
