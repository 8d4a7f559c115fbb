package idemotel_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemotel"
	"github.com/idemkit/idem/stores/memstore"
)

// TestTakeover: a request that takes a crashed holder's lapsed lease over
// is counted as idem.outcome=takeover (and acquired, once), adds the span
// event idem.takeover naming the previous owner's host and process, and
// logs one warning with the whole scoped key idemctl takes.
func TestTakeover(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	hook, err := idemotel.NewEventHook(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	e, err := idem.New(store, idem.WithEventHook(hook), idem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	req := func() *idem.Request {
		return &idem.Request{Method: "POST", Route: "/v1/payments", Path: "/v1/payments", Principal: "u1",
			ContentType: "application/json", Keys: []string{"k1"}, Body: []byte(`{"amount":100}`)}
	}
	scoped := idem.ScopedKey("u1", "POST", "/v1/payments", "k1")
	fp := idem.Fingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"amount":100}`))
	// A holder on host "web-7", process 4242, took the key and crashed.
	if _, ok, err := store.Acquire(context.Background(), scoped, "web-7:4242:abc.1", fp, 20*time.Millisecond); err != nil || !ok {
		t.Fatalf("crashed holder's acquire: %v, %v", ok, err)
	}
	time.Sleep(50 * time.Millisecond)
	ctx, span := tp.Tracer("test").Start(context.Background(), "POST /v1/payments")
	x, resp := e.Begin(ctx, req())
	if x == nil {
		t.Fatalf("Begin after the holder's lease lapsed = %+v; want the takeover to execute", resp)
	}
	x.Finish(201, nil)
	span.End()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	m, _ := find(rm, idemotel.DecisionsName)
	got := map[string]int64{}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		got[str(dp.Attributes, idemotel.OutcomeKey)] += dp.Value
	}
	if got["takeover"] != 1 || got["acquired"] != 1 || got["completed"] != 1 {
		t.Fatalf("decisions %v; want takeover, acquired and completed once each", got)
	}
	var found bool
	for _, ev := range spans.Ended()[0].Events() {
		if ev.Name != idemotel.TakeoverEvent {
			continue
		}
		found = true
		for _, a := range ev.Attributes {
			if a.Key == idemotel.PreviousOwnerKey && a.Value.AsString() != "web-7:4242" {
				t.Errorf("%s = %q, want web-7:4242", idemotel.PreviousOwnerKey, a.Value.AsString())
			}
			if a.Key == idemotel.LapsedKey && a.Value.AsFloat64() <= 0 {
				t.Errorf("%s = %v, want > 0", idemotel.LapsedKey, a.Value.AsFloat64())
			}
		}
	}
	if !found {
		t.Fatalf("span events %+v; want %s", spans.Ended()[0].Events(), idemotel.TakeoverEvent)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var warned int
	for _, l := range lines {
		if strings.Contains(l, "took over a lapsed lease") {
			warned++
			if !strings.Contains(l, "level=WARN") || !strings.Contains(l, "key="+scoped) || !strings.Contains(l, "previous_owner=web-7:4242") {
				t.Errorf("takeover log line %q; want WARN with the whole key and the previous owner", l)
			}
		}
	}
	if warned != 1 {
		t.Fatalf("%d takeover log lines in %q; want 1", warned, logs.String())
	}
}
