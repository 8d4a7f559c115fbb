package mongostore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mongostore"
)

var quiet = slog.New(slog.DiscardHandler)

func TestConformance(t *testing.T) {
	c, _ := shared(t)
	storetest.Run(t, func(t *testing.T) idem.Store {
		s := mongostore.New(collection(t, c))
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestJournal(t *testing.T) {
	c, _ := shared(t)
	storetest.RunJournal(t, func(t *testing.T) idem.Store {
		s := mongostore.New(collection(t, c))
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func payment(key, body string) *idem.Request {
	return &idem.Request{
		Method: http.MethodPost, Path: "/v1/payments", ContentType: "application/json",
		Keys: []string{key}, Principal: "acct_1", Body: []byte(body),
	}
}

// TestRoundTrips counts the commands each engine decision sends, with the
// driver's command monitor.
func TestRoundTrips(t *testing.T) {
	var mu sync.Mutex
	var cmds []string
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		mu.Lock()
		cmds = append(cmds, e.CommandName)
		mu.Unlock()
	}}
	c := connect(t, options.Client().SetMonitor(mon))
	coll := c.Database(testDB).Collection(randomName("rt_"))
	t.Cleanup(func() { drop(coll) })
	measure := func(f func()) []string {
		mu.Lock()
		cmds = nil
		mu.Unlock()
		f()
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(cmds)
	}
	expect := func(what string, got []string, want ...string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s sent %d commands %v; want %d %v", what, len(got), got, len(want), want)
		} else {
			t.Logf("%s: %d round trip(s) %v", what, len(got), got)
		}
	}

	var s *mongostore.Store
	expect("New", measure(func() { s = mongostore.New(coll, mongostore.WithClockRefresh(time.Hour)) }))
	expect("first operation (reads the server clock)", measure(func() { _, _, _ = s.Get(ctxT(t), "warm-up") }), "hello", "find")

	e, err := idem.New(s, idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	hdr := http.Header{"Content-Type": {"application/json"}}
	expect("first execution", measure(func() {
		x, resp := e.Begin(ctx, payment("k1", `{"amount":1}`))
		if x == nil {
			t.Fatalf("first request not executed: %+v", resp)
		}
		_, _ = x.Write([]byte(`{"id":"pay_1"}`))
		x.Finish(http.StatusCreated, hdr)
	}), "findAndModify", "update")
	expect("replay", measure(func() {
		x, resp := e.Begin(ctx, payment("k1", `{"amount":1}`))
		if x != nil || resp.Status != http.StatusCreated || !resp.IsReplay() {
			t.Errorf("duplicate: x=%v resp=%+v; want a replay", x, resp)
		}
	}), "findAndModify")
	expect("mismatch", measure(func() {
		if _, resp := e.Begin(ctx, payment("k1", `{"amount":2}`)); resp == nil || resp.Status != http.StatusUnprocessableEntity {
			t.Errorf("reused key: resp=%+v; want 422", resp)
		}
	}), "findAndModify")

	x2, _ := e.Begin(ctx, payment("k2", `{}`))
	if x2 == nil {
		t.Fatal("k2 not executed")
	}
	expect("conflict", measure(func() {
		if _, resp := e.Begin(ctx, payment("k2", `{}`)); resp == nil || resp.Status != http.StatusConflict {
			t.Errorf("duplicate in progress: resp=%+v; want 409", resp)
		}
	}), "findAndModify")
	expect("release (handler failed)", measure(x2.Fail), "find", "insert", "delete")

	// Takeover: a completed record whose retention is over.
	short, err := idem.New(s, idem.WithRetention(100*time.Millisecond), idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	x3, _ := short.Begin(ctx, payment("k3", `{}`))
	if x3 == nil {
		t.Fatal("k3 not executed")
	}
	x3.Finish(http.StatusOK, nil)
	time.Sleep(250 * time.Millisecond)
	var x4 *idem.Execution
	expect("takeover of an expired record", measure(func() {
		var resp *idem.Response
		if x4, resp = e.Begin(ctx, payment("k3", `{}`)); x4 == nil {
			t.Fatalf("expired k3 not executed again: %+v", resp)
		}
	}), "findAndModify", "insert", "update")
	x4.Finish(http.StatusOK, nil)

	// The clock offset is measured again once stale.
	const refresh = 500 * time.Millisecond
	s2 := mongostore.New(coll, mongostore.WithClockRefresh(refresh))
	measured := time.Now() // the offset is read after this
	expect("first Get", measure(func() { _, _, _ = s2.Get(ctx, "k1") }), "hello", "find")
	within := measure(func() { _, _, _ = s2.Get(ctx, "k1") })
	if time.Since(measured) < refresh { // else the machine stalled past the interval: nothing to check
		expect("Get within the refresh interval", within, "find")
	}
	time.Sleep(refresh + 50*time.Millisecond)
	expect("Get after the refresh interval", measure(func() { _, _, _ = s2.Get(ctx, "k1") }), "hello", "find")
}

// idemHandler is a minimal adapter driving the engine directly: it counts
// executions and answers 201 after a short pause.
func idemHandler(e *idem.Engine, executions *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		x, resp := e.Begin(r.Context(), &idem.Request{
			Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
			ContentType: r.Header.Get("Content-Type"), Keys: r.Header.Values(e.Header()),
			Principal: r.Header.Get("X-Principal"), Body: body,
		})
		if resp != nil {
			resp.Send(w)
			return
		}
		if x == nil {
			w.WriteHeader(http.StatusInternalServerError) // not covered: never in these tests
			return
		}
		n := executions.Add(1)
		time.Sleep(100 * time.Millisecond)
		out := fmt.Appendf(nil, `{"id":"pay_%d"}`, n)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(out)
		_, _ = x.Write(out)
		x.Finish(http.StatusCreated, w.Header())
	})
}

type answer struct {
	status   int
	replayed bool
	body     string
	err      error
}

func post(url, key string) answer {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/payments", strings.NewReader(`{"amount":100}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Principal", "acct_1")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, replayed: resp.Header.Get(idem.ReplayedHeader) == "true", body: string(b), err: err}
}

// TestMultiInstance runs three service instances, each with its own client,
// store and engine, behind three HTTP servers sharing one collection, and
// sends 60 concurrent duplicates spread over them.
func TestMultiInstance(t *testing.T) {
	name := randomName("multi_")
	var executions atomic.Int32
	var urls []string
	for i := 0; i < 3; i++ {
		c := connect(t)
		coll := c.Database(testDB).Collection(name)
		if i == 0 {
			t.Cleanup(func() { drop(coll) })
		}
		s := mongostore.New(coll)
		e, err := idem.New(s, idem.WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(idemHandler(e, &executions))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	const n = 60
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// Spread over 300ms, longer than the 100ms handler: duplicates
			// arrive while it runs (409) and after it finished (replay).
			time.Sleep(time.Duration(i) * 5 * time.Millisecond)
			answers[i] = post(urls[i%3], "order-42")
		}()
	}
	close(start)
	wg.Wait()

	if got := executions.Load(); got != 1 {
		t.Fatalf("%d executions for %d concurrent duplicates on 3 instances; want exactly 1", got, n)
	}
	var original string
	var originals, replays, conflicts int
	for _, a := range answers {
		switch {
		case a.err != nil:
			t.Fatalf("request failed: %v", a.err)
		case a.status == http.StatusCreated && !a.replayed:
			originals++
			original = a.body
		case a.status == http.StatusCreated:
			replays++
		case a.status == http.StatusConflict:
			conflicts++
		default:
			t.Fatalf("unexpected answer %d %s", a.status, a.body)
		}
	}
	if originals != 1 {
		t.Fatalf("%d original 201 answers; want 1", originals)
	}
	for _, a := range answers {
		if a.replayed && a.body != original {
			t.Fatalf("replay body %q differs from the original %q", a.body, original)
		}
	}
	t.Logf("%d requests: 1 execution, %d replays, %d conflicts", n, replays, conflicts)
	if replays == 0 || conflicts == 0 {
		t.Errorf("%d replays and %d conflicts; want both kinds among the staggered duplicates", replays, conflicts)
	}
	for _, u := range urls {
		if a := post(u, "order-42"); a.status != http.StatusCreated || !a.replayed || a.body != original {
			t.Fatalf("later duplicate on %s = %d replayed=%v %q; want the replay of %q", u, a.status, a.replayed, a.body, original)
		}
	}
	if got := executions.Load(); got != 1 {
		t.Fatalf("%d executions after the later duplicates; want 1", got)
	}
}

// TestExpiredNotPurged checks that a record past its retention but still
// stored (the TTL monitor runs about once a minute) is treated as absent.
func TestExpiredNotPurged(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, tok, "fp-a", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if err := s.Complete(ctx, key, tok, []byte("x"), 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: key}}); err != nil || n != 1 {
		t.Fatalf("stored documents for the expired key = %d, %v; want 1 (not purged yet)", n, err)
	}
	if rec, found, err := s.Get(ctx, key); err != nil || found {
		t.Fatalf("Get of an expired record = %+v, %v, %v; want absent", rec, found, err)
	}
	tok2 := storetest.Token()
	if rec, ok, err := s.Acquire(ctx, key, tok2, "fp-b", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire over an expired record = %+v, %v, %v; want acquired", rec, ok, err)
	}
	var raw bson.M
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	if _, has := raw["response"]; has || raw["token"] != tok2 || raw["fingerprint"] != "fp-b" || raw["state"] != int32(1) {
		t.Fatalf("record after takeover = %v; want the new in-progress record without the old response", raw)
	}
}

func TestPurge(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	var live []string
	for i := range 7 {
		key, lease := storetest.Key(), 100*time.Millisecond
		if i >= 5 {
			lease = time.Minute
			live = append(live, key)
		}
		if _, ok, err := s.Acquire(ctx, key, storetest.Token(), "fp", lease); err != nil || !ok {
			t.Fatalf("Acquire = %v, %v", ok, err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if n, err := s.Purge(ctx); err != nil || n != 5 {
		t.Fatalf("Purge = %d, %v; want 5 expired records deleted", n, err)
	}
	records := bson.D{{Key: "state", Value: bson.D{{Key: "$in", Value: bson.A{1, 2}}}}}
	if n, err := coll.CountDocuments(ctx, records); err != nil || n != 2 {
		t.Fatalf("records left = %d, %v; want the 2 live ones", n, err)
	}
	for _, k := range live {
		if _, found, err := s.Get(ctx, k); err != nil || !found {
			t.Fatalf("live record gone after Purge: %v, %v", found, err)
		}
	}
	if n, err := s.Purge(ctx); err != nil || n != 0 {
		t.Fatalf("second Purge = %d, %v; want 0", n, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Purge(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("Purge with a cancelled context = %v", err)
	}
}

func TestEnsureIndexes(t *testing.T) {
	c, ferret := shared(t)
	coll := collection(t, c)
	var buf syncBuffer
	s := mongostore.New(coll, mongostore.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	ctx := ctxT(t)
	for i := 0; i < 2; i++ { // idempotent
		if err := s.EnsureIndexes(ctx); err != nil {
			t.Fatalf("EnsureIndexes #%d: %v", i+1, err)
		}
	}
	cur, err := coll.Indexes().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var idx []bson.M
	if err := cur.All(ctx, &idx); err != nil {
		t.Fatal(err)
	}
	byName := map[string]bson.M{}
	for _, ix := range idx {
		byName[fmt.Sprint(ix["name"])] = ix
	}
	if ferret {
		if !strings.Contains(buf.String(), "server rejects TTL indexes") {
			t.Fatalf("FerretDB: EnsureIndexes logged %q; want the TTL fallback warning", buf.String())
		}
		if _, ok := byName["idem_expiresAt"]; !ok {
			t.Fatalf("FerretDB: indexes %v; want the plain expiresAt index", idx)
		}
		return
	}
	ttl, ok := byName["idem_expiresAt_ttl"]
	if !ok || fmt.Sprint(ttl["expireAfterSeconds"]) != "0" {
		t.Fatalf("indexes %v; want idem_expiresAt_ttl with expireAfterSeconds 0", idx)
	}
	if buf.Len() != 0 {
		t.Fatalf("EnsureIndexes on MongoDB logged %q", buf.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

// TestPurger checks the background purger deletes expired records and that
// Close stops it (goleak in TestMain checks no goroutine is left).
func TestPurger(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll, mongostore.WithLogger(quiet))
	ctx := ctxT(t)
	if err := s.StartPurger(0); !errors.Is(err, idem.ErrInvalidDuration) {
		t.Fatalf("StartPurger(0) = %v; want ErrInvalidDuration", err)
	}
	if _, ok, err := s.Acquire(ctx, storetest.Key(), storetest.Token(), "fp", 50*time.Millisecond); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if err := s.StartPurger(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := s.StartPurger(100 * time.Millisecond); err == nil {
		t.Fatal("second StartPurger = nil; want an error")
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		n, err := coll.CountDocuments(ctx, bson.D{{Key: "state", Value: bson.D{{Key: "$in", Value: bson.A{1, 2}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("purger left %d expired records after 2 minutes", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.StartPurger(time.Second); err == nil {
		t.Fatal("StartPurger after Close = nil; want an error")
	}
	// The store stays usable after Close; Close left the client connected.
	if _, _, err := s.Get(ctx, storetest.Key()); err != nil {
		t.Fatalf("Get after Close: %v", err)
	}
}

// TestTooLarge checks that a response above the BSON document limit is
// refused without side effects, leaving the lease to its owner.
func TestTooLarge(t *testing.T) {
	c, _ := shared(t)
	s := mongostore.New(collection(t, c))
	ctx := ctxT(t)
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	huge := make([]byte, 17<<20)
	if err := s.Complete(ctx, key, tok, huge, time.Hour); !errors.Is(err, mongostore.ErrTooLarge) {
		t.Fatalf("Complete with a 17 MiB body = %v; want ErrTooLarge", err)
	}
	rec, found, err := s.Get(ctx, key)
	if err != nil || !found || rec.State != idem.StateInProgress || rec.Token != tok {
		t.Fatalf("record after a refused Complete = %+v, %v, %v; want still in progress", rec, found, err)
	}
	if err := s.Complete(ctx, key, tok, []byte("a small response"), time.Hour); err != nil {
		t.Fatalf("owner's second Complete with a small response: %v", err)
	}
}

// TestStoredShape checks the document layout other tools rely on: a BSON
// date for the TTL index, the response as BSON binary, the fingerprint kept.
func TestStoredShape(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, tok, "fp-1", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	resp := []byte{1, 0xc9, 0x01, 1, 5, 'X', '-', 'B', 'i', 'n', 1, 3, 0xff, 0, 0xfe, 0, 1, 0xff, 0}
	if err := s.Complete(ctx, key, tok, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	raw, err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	if v := raw.Lookup("expiresAt"); v.Type != bson.TypeDateTime {
		t.Fatalf("expiresAt is BSON %v; want a date (TTL indexes need one)", v.Type)
	}
	if v := raw.Lookup("response"); v.Type != bson.TypeBinary {
		t.Fatalf("response is BSON %v; want binary", v.Type)
	}
	if v := raw.Lookup("fingerprint"); v.StringValue() != "fp-1" {
		t.Fatalf("fingerprint = %v; want kept through completion", v)
	}
	if v := raw.Lookup("state"); v.Int32() != 2 {
		t.Fatalf("state = %v; want 2 (completed)", v)
	}
	rec, _, err := s.Get(ctx, key)
	if err != nil || !bytes.Equal(rec.Response, resp) {
		t.Fatalf("Get = %+v, %v; want the exact bytes back", rec.Response, err)
	}
}

// TestCorruptRecord checks that a record the store did not write is an
// error, not a decision: a document of an unknown state is ErrCorrupt, and
// a completed one whose response does not decode is answered 500 by the
// engine, never executed again.
func TestCorruptRecord(t *testing.T) {
	c, _ := shared(t)
	coll := collection(t, c)
	s := mongostore.New(coll)
	ctx := ctxT(t)
	insert := func(key string, state int32, fp string) {
		t.Helper()
		_, err := coll.InsertOne(ctx, bson.D{
			{Key: "_id", Value: key}, {Key: "state", Value: state}, {Key: "token", Value: "t"},
			{Key: "fingerprint", Value: fp}, {Key: "expiresAt", Value: bson.NewDateTimeFromTime(time.Now().Add(time.Hour))},
			{Key: "response", Value: []byte{9, 9, 9}},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	key := storetest.Key()
	insert(key, 7, "fp")
	if _, _, err := s.Get(ctx, key); !errors.Is(err, idem.ErrCorrupt) {
		t.Fatalf("Get of a record of state 7 = %v; want ErrCorrupt", err)
	}
	if _, _, err := s.Acquire(ctx, key, "t2", "fp", time.Minute); !errors.Is(err, idem.ErrCorrupt) {
		t.Fatalf("Acquire over a record of state 7 = %v; want ErrCorrupt", err)
	}
	e, err := idem.New(s, idem.WithGlobalScope())
	if err != nil {
		t.Fatal(err)
	}
	req := &idem.Request{Method: http.MethodPost, Path: "/p", Keys: []string{`"k"`}, Body: []byte("{}")}
	insert(idem.ScopedKey("", http.MethodPost, "/p", "k"), 2, idem.Fingerprint(http.MethodPost, "/p", "", "", req.Body))
	if x, resp := e.Begin(ctx, req); x != nil || resp.Status != http.StatusInternalServerError {
		t.Fatalf("a completed record whose response does not decode: x=%v resp=%+v; want 500", x, resp)
	}
}

// TestRecovery runs the recovery suite with a history of 300 completed
// records: FerretDB (the test server) writes them at a few hundred a
// second when the machine is quiet and far fewer under load (10,000 did
// not finish in 10 minutes at a load average of 20); the sparse dueAt index
// leaves completed records out whatever their number.
func TestRecovery(t *testing.T) {
	c, _ := shared(t)
	storetest.RunRecovery(t, func(t *testing.T) idem.Store {
		s := mongostore.New(collection(t, c))
		t.Cleanup(func() { s.Close() })
		return s
	}, storetest.WithHistory(300))
}
