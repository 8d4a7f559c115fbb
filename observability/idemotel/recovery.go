package idemotel

import (
	"context"

	"go.opentelemetry.io/otel/metric"

	idem "github.com/idemkit/idem/core"
)

// Instrument names of a [idem.Recoverer]'s passes ([idem.EventRecoveryPass]).
const (
	RecoveryPassesName    = "idem.recovery.passes"    // Counter, unit {pass}
	RecoveryDueName       = "idem.recovery.due"       // Counter, unit {record}: due records the passes saw
	RecoveryClaimedName   = "idem.recovery.claimed"   // Counter, unit {record}
	RecoveryRecoveredName = "idem.recovery.recovered" // Counter, unit {record}
	RecoveryDeferredName  = "idem.recovery.deferred"  // Counter, unit {record}
	RecoveryParkedName    = "idem.recovery.parked"    // Counter, unit {record}
	RecoveryDueAgeName    = "idem.recovery.due.age"   // Gauge, unit s: how long the oldest record the last pass claimed had been due
)

type recoveryInstruments struct {
	passes                                    metric.Int64Counter
	due, claimed, recovered, deferred, parked metric.Int64Counter
	dueAge                                    metric.Float64Gauge
}

func newRecoveryInstruments(m metric.Meter) (*recoveryInstruments, error) {
	r := &recoveryInstruments{}
	var err error
	counters := []struct {
		dst        *metric.Int64Counter
		name, unit string
		desc       string
	}{
		{&r.passes, RecoveryPassesName, "{pass}", "Recoverer passes ended."},
		{&r.due, RecoveryDueName, "{record}", "Records due for recovery that recoverer passes saw."},
		{&r.claimed, RecoveryClaimedName, "{record}", "Due records recoverer passes claimed."},
		{&r.recovered, RecoveryRecoveredName, "{record}", "Recovery runs that stored the execution's answer."},
		{&r.deferred, RecoveryDeferredName, "{record}", "Recovery runs that ended without an answer to store (due again after the backoff)."},
		{&r.parked, RecoveryParkedName, "{record}", "Records parked uncertain by a recoverer, their attempts exhausted."},
	}
	for _, c := range counters {
		if *c.dst, err = m.Int64Counter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.desc)); err != nil {
			return nil, err
		}
	}
	if r.dueAge, err = m.Float64Gauge(RecoveryDueAgeName, metric.WithUnit("s"),
		metric.WithDescription("How long the oldest record the last recoverer pass claimed had been due: near the recovery interval when the recoverer keeps up.")); err != nil {
		return nil, err
	}
	return r, nil
}

// record records one pass's report.
func (r *recoveryInstruments) record(ctx context.Context, rep *idem.RecoveryReport) {
	if rep == nil {
		return
	}
	r.passes.Add(ctx, 1)
	r.due.Add(ctx, int64(rep.Due))
	r.claimed.Add(ctx, int64(rep.Claimed))
	r.recovered.Add(ctx, int64(rep.Recovered))
	r.deferred.Add(ctx, int64(rep.Deferred))
	r.parked.Add(ctx, int64(rep.Parked))
	if rep.Claimed > 0 {
		r.dueAge.Record(ctx, rep.OldestDue.Seconds())
	}
}
