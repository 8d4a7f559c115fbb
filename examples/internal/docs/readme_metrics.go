package docs

// doc: README.md
import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idem/observability/idemotel"
)

// doc end

import (
	"github.com/gin-gonic/gin"

	idem "github.com/idemkit/idem/core"
)

func readmeMetrics() {
	r := gin.New()
	// doc: README.md
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter)))
	hook, err := idemotel.NewEventHook()
	engine, err := idem.New(store, idem.WithEventHook(hook))
	r.GET("/metrics", gin.WrapH(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))) // outside your authentication
	// doc end
	_, _ = engine, err
}
