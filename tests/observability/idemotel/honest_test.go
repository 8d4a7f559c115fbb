package idemotel_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemotel"
	"github.com/idemkit/idem/stores/memstore"
)

// TestRefusalOutcomes: a replay the replay check refuses counts as
// idem.outcome=replay-forbidden, a record of an unknown fingerprint
// function as fingerprint-changed.
func TestRefusalOutcomes(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	reader := sdkmetric.NewManualReader()
	hook, err := idemotel.NewEventHook(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	quiet := idem.WithLogger(slog.New(slog.DiscardHandler))
	other, err := idem.New(store, quiet, idem.WithFingerprint(idem.JSONFingerprint()))
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(store, quiet, idem.WithEventHook(hook), idem.WithReplayCheck(func(_ context.Context, info idem.ReplayInfo) error {
		if info.Outcome == idem.EventReplayed {
			return errors.New("revoked")
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	run := func(e *idem.Engine, key string) int {
		x, resp := e.Begin(context.Background(), &idem.Request{Method: "POST", Route: "/v1/payments", Path: "/v1/payments", Principal: "u1", Keys: []string{key}, Body: []byte(`{}`)})
		if x != nil {
			x.Finish(201, nil)
			return 201
		}
		return resp.Status
	}
	run(other, "k1")
	if got := run(e, "k1"); got != 422 {
		t.Fatalf("record of another fingerprint function: %d, want 422", got)
	}
	run(e, "k2")
	if got := run(e, "k2"); got != 403 {
		t.Fatalf("refused replay: %d, want 403", got)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	m, _ := find(rm, idemotel.DecisionsName)
	got := map[string]int64{}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		got[str(dp.Attributes, idemotel.OutcomeKey)] += dp.Value
	}
	want := map[string]int64{"fingerprint-changed": 1, "acquired": 1, "completed": 1, "replay-forbidden": 1}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s{outcome=%s} = %d, want %d", idemotel.DecisionsName, k, got[k], n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("outcomes %v, want exactly %v", got, want)
	}
}
