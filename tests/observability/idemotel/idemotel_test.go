package idemotel_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemotel"
	"github.com/idemkit/idem/stores/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// faultStore is a memstore whose acquisitions fail or whose completions
// find the lease gone, on demand.
type faultStore struct {
	*memstore.Store
	failAcquire  atomic.Bool
	loseComplete atomic.Bool
}

var errDown = errors.New("store down")

func (s *faultStore) Acquire(ctx context.Context, key, token, fp string, lease time.Duration) (idem.Record, bool, error) {
	if s.failAcquire.Load() {
		return idem.Record{}, false, errDown
	}
	return s.Store.Acquire(ctx, key, token, fp, lease)
}

func (s *faultStore) Complete(ctx context.Context, key, token string, resp []byte, retention time.Duration) error {
	if s.loseComplete.Load() {
		return idem.ErrNotOwner
	}
	return s.Store.Complete(ctx, key, token, resp, retention)
}

type fixture struct {
	t      *testing.T
	store  *faultStore
	engine *idem.Engine
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tracer *sdktrace.TracerProvider
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, store: &faultStore{Store: memstore.New()}, reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	f.tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans))
	hook, err := idemotel.NewEventHook(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))))
	if err != nil {
		t.Fatal(err)
	}
	f.engine, err = idem.New(f.store, idem.WithEventHook(hook), idem.WithCompletionRetry(0), idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.engine.Close(context.Background())
		_ = f.store.Close()
		_ = f.tracer.Shutdown(context.Background())
	})
	return f
}

// begin runs Begin for user u1 inside a span named name, which stays open
// until end is called (or at once when end is nil: the request was answered).
func (f *fixture) begin(name, key, body string) (x *idem.Execution, resp *idem.Response, end func()) {
	ctx, span := f.tracer.Tracer("test").Start(context.Background(), name)
	req := &idem.Request{Method: "POST", Route: "/v1/payments", Path: "/v1/payments", Principal: "u1", Body: []byte(body)}
	if key != "" {
		req.Keys = []string{key}
	}
	x, resp = f.engine.Begin(ctx, req)
	if x == nil {
		span.End()
		return nil, resp, nil
	}
	return x, nil, func() { span.End() }
}

func (f *fixture) collect() metricdata.ResourceMetrics {
	f.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		f.t.Fatal(err)
	}
	return rm
}

func find(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

func str(set attribute.Set, k attribute.Key) string {
	v, _ := set.Value(k)
	return v.String()
}

// TestScriptedSequence drives the engine through every outcome and checks
// exact counts per outcome, histogram counts, the in-progress counter and
// the span data.
func TestScriptedSequence(t *testing.T) {
	f := newFixture(t)
	status := func(resp *idem.Response) int {
		if resp == nil {
			return 0
		}
		return resp.Status
	}

	fresh, _, endFresh := f.begin("fresh", "k1", `{"amount":1}`) // acquired
	if fresh == nil {
		t.Fatal("fresh request was not executed")
	}
	if m, ok := find(f.collect(), idemotel.ActiveName); !ok || sumOf(m) != 1 {
		t.Errorf("%s while a handler runs = %v, want 1", idemotel.ActiveName, sumOf(m))
	}
	if _, resp, _ := f.begin("conflict", "k1", `{"amount":1}`); status(resp) != 409 {
		t.Fatalf("duplicate in progress: %d, want 409", status(resp))
	}
	fresh.Finish(201, nil) // completed
	endFresh()
	if _, resp, _ := f.begin("replay", "k1", `{"amount":1}`); status(resp) != 201 || !resp.IsReplay() {
		t.Fatalf("retry: %d, want a 201 replay", status(resp))
	}
	if _, resp, _ := f.begin("mismatch", "k1", `{"amount":2}`); status(resp) != 422 {
		t.Fatalf("other payload: %d, want 422", status(resp))
	}
	if _, resp, _ := f.begin("rejected", "", `{}`); status(resp) != 400 {
		t.Fatalf("no key: %d, want 400", status(resp))
	}
	failed, _, endFailed := f.begin("released", "k2", `{}`)
	failed.Finish(502, nil) // released
	endFailed()
	f.store.loseComplete.Store(true)
	lost, _, endLost := f.begin("lease-lost", "k3", `{}`)
	lost.Finish(200, nil) // lease-lost
	endLost()
	f.store.loseComplete.Store(false)
	f.store.failAcquire.Store(true)
	if _, resp, _ := f.begin("store-error", "k4", `{}`); status(resp) != 503 {
		t.Fatalf("store down: %d, want 503", status(resp))
	}

	rm := f.collect()
	want := map[string]int64{"acquired": 3, "conflict": 1, "completed": 1, "replayed": 1, "mismatch": 1,
		"rejected": 1, "released": 1, "lease-lost": 1, "store-error": 1}
	m, ok := find(rm, idemotel.DecisionsName)
	if !ok {
		t.Fatalf("no %s metric", idemotel.DecisionsName)
	}
	if m.Unit != "{decision}" {
		t.Errorf("%s unit %q", m.Name, m.Unit)
	}
	got := map[string]int64{}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		got[str(dp.Attributes, idemotel.OutcomeKey)] += dp.Value
		if str(dp.Attributes, "http.request.method") != "POST" || str(dp.Attributes, "http.route") != "/v1/payments" {
			t.Errorf("decision attributes %v, want method POST and route /v1/payments", dp.Attributes.ToSlice())
		}
		if dp.Attributes.Len() != 3 {
			t.Errorf("decision attributes %v: want exactly outcome, method and route", dp.Attributes.ToSlice())
		}
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s{outcome=%s} = %d, want %d", idemotel.DecisionsName, k, got[k], n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("outcomes %v, want exactly %v", got, want)
	}

	m, _ = find(rm, idemotel.HandlerDurationName)
	handler := map[string]uint64{}
	for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		handler[str(dp.Attributes, idemotel.OutcomeKey)] += dp.Count
	}
	if m.Unit != "s" || handler["completed"] != 1 || handler["released"] != 1 || handler["lease-lost"] != 1 || len(handler) != 3 {
		t.Errorf("%s (unit %q) counts %v, want one each of completed, released, lease-lost", m.Name, m.Unit, handler)
	}

	m, _ = find(rm, idemotel.StoreDurationName)
	storeCalls := map[string]uint64{}
	for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		op := str(dp.Attributes, idemotel.StoreOperationKey)
		if et := str(dp.Attributes, "error.type"); et != "" {
			op += " " + et
		}
		storeCalls[op] += dp.Count
	}
	// acquire: 3 acquired, conflict, replayed, mismatch; the failed one has error.type.
	wantCalls := map[string]uint64{"acquire": 6, "acquire *errors.errorString": 1, "complete": 2, "release": 1}
	if m.Unit != "s" || len(storeCalls) != len(wantCalls) {
		t.Errorf("%s (unit %q) counts %v, want %v", m.Name, m.Unit, storeCalls, wantCalls)
	}
	for k, n := range wantCalls {
		if storeCalls[k] != n {
			t.Errorf("%s{%s} count = %d, want %d", m.Name, k, storeCalls[k], n)
		}
	}

	if m, ok := find(rm, idemotel.ActiveName); !ok || sumOf(m) != 0 || m.Unit != "{execution}" {
		t.Errorf("%s = %d (unit %q) after every execution ended, want 0", idemotel.ActiveName, sumOf(m), m.Unit)
	}

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range f.spans.Ended() {
		spans[s.Name()] = s
	}
	wantOutcome := map[string]string{"fresh": "completed", "conflict": "conflict", "replay": "replayed", "mismatch": "mismatch",
		"rejected": "rejected", "released": "released", "lease-lost": "lease-lost", "store-error": "store-error"}
	k1 := idem.ScopedKey("u1", "POST", "/v1/payments", "k1")
	for name, outcome := range wantOutcome {
		s, ok := spans[name]
		if !ok {
			t.Errorf("no span %q", name)
			continue
		}
		attrs := attribute.NewSet(s.Attributes()...)
		if got := str(attrs, idemotel.OutcomeKey); got != outcome {
			t.Errorf("span %q: %s = %q, want %q", name, idemotel.OutcomeKey, got, outcome)
		}
		key := str(attrs, idemotel.ScopedKeyKey)
		if name == "rejected" && key != "" || name != "rejected" && len(key) != 64 {
			t.Errorf("span %q: %s = %q", name, idemotel.ScopedKeyKey, key)
		}
		for _, kv := range s.Attributes() {
			if v := kv.Value.String(); v == "k1" || v == "u1" || strings.Contains(v, "amount") {
				t.Errorf("span %q carries the raw key, principal or body: %s=%s", name, kv.Key, v)
			}
		}
	}
	if key := str(attribute.NewSet(spans["replay"].Attributes()...), idemotel.ScopedKeyKey); key != k1 {
		t.Errorf("replay span scoped key %q, want %q", key, k1)
	}
	wantEvent := map[string]string{"lease-lost": idemotel.LeaseLostEvent, "store-error": idemotel.StoreErrorEvent}
	for name, s := range spans {
		var events []string
		for _, e := range s.Events() {
			events = append(events, e.Name)
		}
		if got := strings.Join(events, ","); got != wantEvent[name] {
			t.Errorf("span %q events %q, want %q", name, got, wantEvent[name])
		}
	}
	se := spans["store-error"].Events()[0]
	if attrs := attribute.NewSet(se.Attributes...); str(attrs, idemotel.StoreOperationKey) != "acquire" || str(attrs, "exception.message") != "store down" {
		t.Errorf("store-error span event attributes %v", se.Attributes)
	}
}

func sumOf(m metricdata.Metrics) int64 {
	s, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		return -1
	}
	var n int64
	for _, dp := range s.DataPoints {
		n += dp.Value
	}
	return n
}

// TestNoRoute checks that http.route is left out, not filled with the
// path, when the adapter reported no route template.
func TestNoRoute(t *testing.T) {
	f := newFixture(t)
	_, _ = f.engine.Begin(context.Background(), &idem.Request{Method: "POST", Path: "/orders/8127", Principal: "u1", Keys: []string{"k"}})
	m, _ := find(f.collect(), idemotel.DecisionsName)
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if v, ok := dp.Attributes.Value("http.route"); ok {
			t.Errorf("http.route = %q without a route template", v.String())
		}
	}
}

// TestRoutes checks that events of several methods and routes, interleaved,
// are counted under their own attributes (the hook reuses attribute sets
// per method, route and outcome).
func TestRoutes(t *testing.T) {
	f := newFixture(t)
	routes := []string{"/v1/payments", "/v1/refunds", "/v1/payments/:id"}
	for i := range 7 {
		for j, route := range routes {
			method := "POST"
			if j == 2 {
				method = "PATCH"
			}
			req := &idem.Request{Method: method, Route: route, Path: route, Principal: "u1", Keys: []string{strconv.Itoa(i % (j + 1))}}
			if x, _ := f.engine.Begin(context.Background(), req); x != nil {
				x.Finish(200, nil)
			}
		}
	}
	// Route j sees j+1 distinct keys among 7 requests: j+1 executions, 6-j replays.
	m, _ := find(f.collect(), idemotel.DecisionsName)
	got := map[string]int64{}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		got[str(dp.Attributes, "http.request.method")+" "+str(dp.Attributes, "http.route")+" "+str(dp.Attributes, idemotel.OutcomeKey)] += dp.Value
	}
	want := map[string]int64{
		"POST /v1/payments acquired": 1, "POST /v1/payments completed": 1, "POST /v1/payments replayed": 6,
		"POST /v1/refunds acquired": 2, "POST /v1/refunds completed": 2, "POST /v1/refunds replayed": 5,
		"PATCH /v1/payments/:id acquired": 3, "PATCH /v1/payments/:id completed": 3, "PATCH /v1/payments/:id replayed": 4,
	}
	if len(got) != len(want) {
		t.Errorf("data points %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s{%s} = %d, want %d", idemotel.DecisionsName, k, got[k], n)
		}
	}
}
