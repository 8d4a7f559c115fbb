package idemotel_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/observability/idemotel"
	"github.com/idemkit/idem/stores/memstore"
)

// TestRecoveryPassMetrics: a recoverer's pass that finds one crashed
// operation due and recovers it is recorded as one idem.recovery.passes,
// one due, claimed and recovered record, none deferred or parked, and the
// time it had been due as idem.recovery.due.age; the pass is no decision.
func TestRecoveryPassMetrics(t *testing.T) {
	mem := memstore.New()
	defer mem.Close()
	store := adaptertest.CrashableRecoverable(mem)
	reader := sdkmetric.NewManualReader()
	hook, err := idemotel.NewEventHook(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(store, idem.WithEventHook(hook), idem.WithLogger(slog.New(slog.DiscardHandler)),
		idem.WithLease(time.Second), idem.WithStoreTimeout(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(context.Background()) }()
	op := idem.Operation{Name: "charge", Key: "k1", Recover: true}
	hold := make(chan struct{})
	started := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(hold)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = idem.Do(context.Background(), e, op, func(context.Context) (int, error) { close(started); <-hold; return 0, nil })
	}()
	<-started
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) { // its lease lapses: it crashed
		due, err := store.(idem.Recoverable).Lapsed(context.Background(), 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(due) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the crashed operation was not due within 2 minutes")
		}
	}
	r, err := idem.NewRecoverer(e)
	if err != nil {
		t.Fatal(err)
	}
	r.Handle("charge", func(ctx context.Context, op idem.Operation) error {
		_, err := idem.Do(ctx, e, op, func(context.Context) (int, error) { return 1, nil })
		return err
	})
	if rep, err := r.RecoverOnce(context.Background()); err != nil || rep.Recovered != 1 {
		t.Fatalf("pass = %+v, %v; want the operation recovered", rep, err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int64{
		idemotel.RecoveryPassesName: 1, idemotel.RecoveryDueName: 1, idemotel.RecoveryClaimedName: 1,
		idemotel.RecoveryRecoveredName: 1, idemotel.RecoveryDeferredName: 0, idemotel.RecoveryParkedName: 0,
	} {
		m, ok := find(rm, name)
		if !ok {
			t.Errorf("no %s", name)
			continue
		}
		var got int64
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			got += dp.Value
		}
		if got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	m, ok := find(rm, idemotel.RecoveryDueAgeName)
	if !ok {
		t.Fatalf("no %s", idemotel.RecoveryDueAgeName)
	}
	if dps := m.Data.(metricdata.Gauge[float64]).DataPoints; len(dps) != 1 || dps[0].Value <= 0 {
		t.Fatalf("%s = %+v; want one point > 0 (the record had been due since its lease lapsed)", idemotel.RecoveryDueAgeName, dps)
	}
	d, _ := find(rm, idemotel.DecisionsName)
	for _, dp := range d.Data.(metricdata.Sum[int64]).DataPoints {
		if o := str(dp.Attributes, idemotel.OutcomeKey); o == idem.EventRecoveryPass.String() {
			t.Fatalf("the pass was counted as a decision: %+v", dp)
		}
	}
}
