package outboxtest

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/adapters/idemkafka"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/stores/pgstore"
)

// The park tests: idemkafka's consumer on kfake and pgstore, for the
// records it parks in the dead-letter topic (a key in progress elsewhere
// beyond the in-progress limit, an uncertain record) and for a park that
// fails (produces to the topic refused, the topic missing). Each checks the dead-letter record's headers, that the parked
// record's offset is committed once the park is acked (never before), and
// that the records after it in its partition are handled.

// dlt is the default dead-letter topic of topic.
func dlt(topic string) string { return topic + idemkafka.DefaultDeadLetterSuffix }

// newParkCluster starts a kfake cluster of three brokers with topic and,
// if withDLT, its dead-letter topic (four partitions each), without the
// produce timeouts newKafkaCluster injects: these tests count the
// dead-letter topic's records, and the faults they add must answer the
// produces to it (kfake answers with the first fault that matches).
func newParkCluster(t *testing.T, topic string, withDLT bool) *kafkaCluster {
	t.Helper()
	topics := []string{topic}
	if withDLT {
		topics = append(topics, dlt(topic))
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(4, topics...), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	k := &kafkaCluster{t: t, topic: topic, c: c}
	for _, a := range c.ListenAddrs() {
		_, p, _ := net.SplitHostPort(a)
		n, _ := strconv.Atoi(p)
		k.ports = append(k.ports, n)
	}
	return k
}

// newParkStore returns a pgstore on a fresh table (dropped at the end) and
// an engine on it with the default lease, renewed while a handler runs.
func newParkStore(t *testing.T, pool *pgxpool.Pool) (*pgstore.Store, *idem.Engine) {
	t.Helper()
	table := uniq("park") + "_idem"
	store := pgstore.New(pool, pgstore.WithTable(table))
	if err := store.EnsureSchema(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(store, idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Close(ctx)
		_ = store.Close()
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{table}.Sanitize())
	})
	return store, e
}

// handlerRuns counts a consumer handler's runs per idempotency key.
type handlerRuns struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *handlerRuns) add(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[key]++
}

func (h *handlerRuns) of(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[key]
}

// runConsumer runs c in group on k's topic, its client made with opts
// too, until the test ends.
func runConsumer(t *testing.T, k *kafkaCluster, c *idemkafka.Consumer, group string, opts ...kgo.Opt) {
	t.Helper()
	cl := k.client(append(append(c.ClientOpts(), kgo.ConsumerGroup(group), kgo.ConsumeTopics(k.topic), kgo.SessionTimeout(3*time.Second)), opts...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx, cl) }()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
}

// record is a record of topic with the partitioning key "customer1" (so
// the records of a test are in one partition, in the order produced) and
// the Idempotency-Key header key, none when key is "".
func record(topic, key, value string) *kgo.Record {
	r := &kgo.Record{Topic: topic, Key: []byte("customer1"), Value: []byte(value)}
	if key != "" {
		r.Headers = []kgo.RecordHeader{{Key: idemkafka.KeyHeader, Value: []byte(key)}}
	}
	return r
}

// produce produces rs in order and waits for their acks; each record's
// partition and offset are set on return.
func produce(t *testing.T, k *kafkaCluster, rs ...*kgo.Record) {
	t.Helper()
	cl := k.client()
	defer cl.Close()
	if err := cl.ProduceSync(ctxT(t, 60*time.Second), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs[1:] {
		if r.Partition != rs[0].Partition {
			t.Fatalf("records in partitions %d and %d; want one", rs[0].Partition, r.Partition)
		}
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// committed returns group's committed offset of topic's partition p, -1
// for none.
func committed(t *testing.T, k *kafkaCluster, group, topic string, p int32) int64 {
	t.Helper()
	cl := k.client()
	defer cl.Close()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic, rt.Partitions = topic, []int32{p}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctxT(t, 30*time.Second), cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("fetching %s's offsets: %v", group, err)
	}
	for _, tp := range resp.Topics {
		for _, pp := range tp.Partitions {
			if tp.Topic == topic && pp.Partition == p {
				if err := kerr.ErrorForCode(pp.ErrorCode); err != nil {
					t.Fatalf("fetching %s's offset of %s/%d: %v", group, topic, p, err)
				}
				return pp.Offset
			}
		}
	}
	return -1
}

// waitCommitted waits until group's committed offset of the partition of
// r is past r.
func waitCommitted(t *testing.T, k *kafkaCluster, group string, r *kgo.Record) {
	t.Helper()
	waitFor(t, "the offset committed past "+r.Topic+"/"+idemkafka.PositionKey(r), 90*time.Second, func() bool {
		return committed(t, k, group, r.Topic, r.Partition) == r.Offset+1
	})
}

// readDeadLetters reads topic's dead-letter topic from the start until it
// has n records, and fails if it holds more.
func readDeadLetters(t *testing.T, k *kafkaCluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := k.client(kgo.ConsumeTopics(dlt(topic)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	ctx := ctxT(t, 90*time.Second)
	var got []*kgo.Record
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("the dead-letter topic has %d records; want %d", len(got), n)
		}
		got = append(got, fs.Records()...)
	}
	if total := deadLetterCount(t, cl, topic); total != int64(n) || len(got) != n {
		t.Fatalf("the dead-letter topic has %d records (%d read); want %d", total, len(got), n)
	}
	return got
}

// deadLetterCount returns how many records topic's dead-letter topic
// holds (the sum of its partitions' end offsets).
func deadLetterCount(t *testing.T, cl *kgo.Client, topic string) int64 {
	t.Helper()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = dlt(topic)
	for p := range int32(4) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	var total int64
	for _, s := range cl.RequestSharded(ctxT(t, 30*time.Second), req) {
		if s.Err != nil {
			t.Fatal(s.Err)
		}
		for _, tp := range s.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, p := range tp.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					t.Fatal(err)
				}
				total += p.Offset
			}
		}
	}
	return total
}

// checkParked fails unless dl is r parked with outcome o: r's key, value
// and headers, the outcome, recordKey (what idemctl takes: the
// operation's [idem.Operation.RecordKey], "" for a record without a key)
// and r's origin.
func checkParked(t *testing.T, dl, r *kgo.Record, o idem.Outcome, recordKey string) {
	t.Helper()
	origin := r.Topic + "/" + idemkafka.PositionKey(r)
	if got := header(dl, idemkafka.HeaderOrigin); got != origin {
		t.Errorf("%s = %q; want %q", idemkafka.HeaderOrigin, got, origin)
	}
	if got := header(dl, idemkafka.HeaderOutcome); got != o.String() {
		t.Errorf("%s of %s = %q; want %q", idemkafka.HeaderOutcome, origin, got, o.String())
	}
	if got := header(dl, idemkafka.HeaderRecordKey); got != recordKey {
		t.Errorf("%s of %s = %q; want %q", idemkafka.HeaderRecordKey, origin, got, recordKey)
	}
	if header(dl, idemkafka.HeaderError) == "" {
		t.Errorf("%s of %s is empty", idemkafka.HeaderError, origin)
	}
	if string(dl.Key) != string(r.Key) || string(dl.Value) != string(r.Value) || header(dl, idemkafka.KeyHeader) != header(r, idemkafka.KeyHeader) {
		t.Errorf("parked %s: key %q, value %q, %s %q; want the record's %q, %q, %q", origin, dl.Key, dl.Value,
			idemkafka.KeyHeader, header(dl, idemkafka.KeyHeader), r.Key, r.Value, header(r, idemkafka.KeyHeader))
	}
}

// TestKafkaParkInProgress: a record whose key stays in progress elsewhere
// (an execution of the operation holding it, its lease renewed) is
// retried in place until the in-progress limit, then parked with outcome
// in-progress and the key's record key; its offset is committed and the
// next record of the partition handled. The handler never runs for the
// held key.
func TestKafkaParkInProgress(t *testing.T) {
	_, pool := openDB(t, outbox.PostgreSQL)
	topic := uniq("k")
	k := newParkCluster(t, topic, true)
	_, e := newParkStore(t, pool)
	held := idem.Operation{Scope: topic, Name: "apply", Key: "held", Payload: []byte("1")}
	holding, release := make(chan struct{}), make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		_, err := idem.Do(context.Background(), e, held, func(context.Context) (struct{}, error) {
			close(holding)
			<-release
			return struct{}{}, nil
		})
		holder <- err
	}()
	stopHolder := sync.OnceValue(func() error {
		close(release)
		return <-holder
	})
	t.Cleanup(func() { _ = stopHolder() })
	select {
	case <-holding:
	case <-ctxT(t, 60*time.Second).Done():
		t.Fatal("the holder never acquired its key")
	}

	var runs handlerRuns
	c := idemkafka.NewConsumer(e, "apply", func(_ context.Context, r *kgo.Record) error {
		runs.add(idemkafka.HeaderKey(r))
		return nil
	}, idemkafka.WithKey(idemkafka.HeaderKey), idemkafka.WithRetryDelay(100*time.Millisecond),
		idemkafka.WithInProgressLimit(time.Second), idemkafka.WithLogger(quiet))
	runConsumer(t, k, c, "park")
	r0, r1 := record(topic, "held", "1"), record(topic, "next", "2")
	produce(t, k, r0, r1)

	waitFor(t, "the record after the held one handled", 120*time.Second, func() bool { return runs.of("next") == 1 })
	dl := readDeadLetters(t, k, topic, 1)
	checkParked(t, dl[0], r0, idem.OutcomeInProgress, held.RecordKey())
	if got := header(dl[0], idemkafka.HeaderError); !strings.Contains(got, idem.ErrInProgress.Error()) {
		t.Errorf("%s = %q; want idem.ErrInProgress's text", idemkafka.HeaderError, got)
	}
	waitCommitted(t, k, "park", r1)
	if n := runs.of("held"); n != 0 {
		t.Errorf("the handler ran %d times for the held key; want 0", n)
	}
	// The holder still holds the key: parking did not touch its record.
	if err := stopHolder(); err != nil {
		t.Fatalf("the holder's Do: %v", err)
	}
}

// TestKafkaParkUncertain: a record whose key's execution crashed inside a
// durable step (idem.Step, not repeatable) is taken over once its lease
// lapses; the step's outcome is unknown, so the execution ends uncertain
// and the record is parked with outcome operation-uncertain and the record
// key idemctl resolves (the store's record there is uncertain, its step
// started and not done). A second copy of the record is parked too without
// running the handler; the step's function never runs again; the offsets
// are committed and the next record is handled.
func TestKafkaParkUncertain(t *testing.T) {
	_, pool := openDB(t, outbox.PostgreSQL)
	topic := uniq("k")
	k := newParkCluster(t, topic, true)
	store, e := newParkStore(t, pool)

	var charges handlerRuns // runs of the step's function, per key
	pay := func(ctx context.Context, key string, hold <-chan struct{}) error {
		_, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
			charges.add(key)
			if hold != nil {
				<-hold
			}
			return "ch_" + key, nil
		})
		return err
	}
	// The crashed execution: an engine whose holder does not renew its
	// lease (adaptertest.CrashableJournal), held inside the step.
	crashed, err := idem.New(adaptertest.CrashableJournal(store), idem.WithLease(4*time.Second), idem.WithStoreTimeout(time.Second), idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	op := idem.Operation{Scope: topic, Name: "apply", Key: "pay-1", Payload: []byte("1200")}
	crash := make(chan struct{})
	crashDone := make(chan struct{})
	go func() {
		defer close(crashDone)
		_, _ = idem.Do(context.Background(), crashed, op, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, pay(ctx, op.Key, crash)
		}) // its journaling and completion are fenced off: the key is not its own any more
	}()
	t.Cleanup(func() {
		close(crash)
		<-crashDone
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = crashed.Close(ctx)
	})
	waitFor(t, "the crashed execution inside its step", 60*time.Second, func() bool { return charges.of(op.Key) == 1 })

	var runs handlerRuns
	c := idemkafka.NewConsumer(e, "apply", func(ctx context.Context, r *kgo.Record) error {
		key := idemkafka.HeaderKey(r)
		runs.add(key)
		return pay(ctx, key, nil)
	}, idemkafka.WithKey(idemkafka.HeaderKey), idemkafka.WithRetryDelay(100*time.Millisecond),
		idemkafka.WithInProgressLimit(10*time.Minute), idemkafka.WithLogger(quiet))
	runConsumer(t, k, c, "park")
	r0, r1, r2 := record(topic, op.Key, "1200"), record(topic, op.Key, "1200"), record(topic, "next", "1")
	produce(t, k, r0, r1, r2)

	waitFor(t, "the record after the uncertain ones handled", 120*time.Second, func() bool { return runs.of("next") == 1 })
	dl := readDeadLetters(t, k, topic, 2)
	for i, r := range []*kgo.Record{r0, r1} {
		checkParked(t, dl[i], r, idem.OutcomeUncertain, op.RecordKey())
	}
	waitCommitted(t, k, "park", r2)
	if n := runs.of(op.Key); n != 1 {
		t.Errorf("the handler ran %d times for the uncertain key; want 1 (the takeover; its copy is parked without a run)", n)
	}
	if n := charges.of(op.Key); n != 1 {
		t.Errorf("the step's function ran %d times; want 1 (the crashed execution's)", n)
	}
	if n := charges.of("next"); n != 1 {
		t.Errorf("the next record's step ran %d times; want 1", n)
	}
	// What an operator finds under the dead-letter record's key.
	ctx := ctxT(t, 30*time.Second)
	rec, found, err := store.Get(ctx, header(dl[0], idemkafka.HeaderRecordKey))
	if err != nil || !found || rec.State != idem.StateUncertain {
		t.Fatalf("the store's record under %s: %+v, found %v, %v; want an uncertain record", idemkafka.HeaderRecordKey, rec, found, err)
	}
	steps, err := store.Steps(ctx, op.RecordKey())
	if err != nil || len(steps) != 1 || steps[0].Name != "charge" || steps[0].Done {
		t.Fatalf("the uncertain record's journal: %+v, %v; want the step charge, started and not done", steps, err)
	}
}

// TestKafkaParkRetried: while every produce to the dead-letter topic
// fails (a kfake fault: TOPIC_AUTHORIZATION_FAILED, as for a consumer not
// allowed to write there), the record to park is retried in place: its
// offset stays uncommitted (the record before it is committed), the
// records after it are not handled, and nothing reaches the dead-letter
// topic. Once the produces succeed, it is parked once, its offset
// committed and the next record handled.
func TestKafkaParkRetried(t *testing.T) {
	_, pool := openDB(t, outbox.PostgreSQL)
	topic := uniq("k")
	k := newParkCluster(t, topic, true)
	_, e := newParkStore(t, pool)
	fault := k.c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: dlt(topic), Err: kerr.TopicAuthorizationFailed, Count: -1})
	t.Cleanup(fault.Remove)

	var runs handlerRuns
	c := idemkafka.NewConsumer(e, "apply", func(_ context.Context, r *kgo.Record) error {
		runs.add(idemkafka.HeaderKey(r))
		return nil
	}, idemkafka.WithKey(idemkafka.HeaderKey), idemkafka.WithRetryDelay(100*time.Millisecond), idemkafka.WithLogger(quiet))
	runConsumer(t, k, c, "park")
	r0, r1, r2 := record(topic, "first", "1"), record(topic, "", "2"), record(topic, "next", "3")
	produce(t, k, r0, r1, r2)

	ctx := ctxT(t, 120*time.Second)
	if err := fault.Wait(ctx, 1); err != nil {
		t.Fatalf("no park attempted: %v", err)
	}
	// The first record is done and committed (the consumer commits before
	// each pause), the keyless one is not.
	waitFor(t, "the offset committed up to the record to park", 90*time.Second, func() bool {
		return committed(t, k, "park", topic, r1.Partition) == r1.Offset
	})
	// Three more failed attempts: still uncommitted, nothing after it run.
	if err := fault.Wait(ctx, fault.Hits()+3); err != nil {
		t.Fatalf("the park was not retried: %v", err)
	}
	if got := committed(t, k, "park", topic, r1.Partition); got != r1.Offset {
		t.Fatalf("committed offset %d while the park fails; want %d, the record to park", got, r1.Offset)
	}
	if runs.of("first") != 1 || runs.of("next") != 0 {
		t.Fatalf("handler runs while the park fails: first %d, next %d; want 1, 0", runs.of("first"), runs.of("next"))
	}
	cl := k.client()
	n := deadLetterCount(t, cl, topic)
	cl.Close()
	if n != 0 {
		t.Fatalf("the dead-letter topic has %d records while every produce to it fails", n)
	}

	attempts := fault.Hits()
	fault.Remove()
	waitFor(t, "the record after the parked one handled", 120*time.Second, func() bool { return runs.of("next") == 1 })
	dl := readDeadLetters(t, k, topic, 1)
	checkParked(t, dl[0], r1, idem.OutcomeKeyMissing, "")
	if got := header(dl[0], idemkafka.HeaderError); !strings.Contains(got, idem.ErrKeyMissing.Error()) {
		t.Errorf("%s = %q; want idem.ErrKeyMissing's text", idemkafka.HeaderError, got)
	}
	waitCommitted(t, k, "park", r2)
	if runs.of("first") != 1 || runs.of("") != 0 {
		t.Errorf("handler runs: first %d, keyless %d; want 1, 0", runs.of("first"), runs.of(""))
	}
	t.Logf("%d park attempts failed before the one that succeeded", attempts)
}

// logCounter is a slog handler counting the records whose message
// contains substr.
type logCounter struct {
	substr string
	n      atomic.Int64
}

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logCounter) WithGroup(string) slog.Handler            { return h }

func (h *logCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.substr) {
		h.n.Add(1)
	}
	return nil
}

// TestKafkaParkMissingTopic: while the dead-letter topic does not exist
// (and the cluster does not create topics on produce), the produce parking
// a record fails (kgo gives up after its UnknownTopicRetries) and the
// record is retried in place, its offset uncommitted and the records
// after it not handled. Once an operator creates the topic, the record is
// parked there, its offset committed and the next record handled.
func TestKafkaParkMissingTopic(t *testing.T) {
	_, pool := openDB(t, outbox.PostgreSQL)
	topic := uniq("k")
	k := newParkCluster(t, topic, false)
	_, e := newParkStore(t, pool)
	failed := &logCounter{substr: "could not be parked"}
	var runs handlerRuns
	c := idemkafka.NewConsumer(e, "apply", func(_ context.Context, r *kgo.Record) error {
		runs.add(idemkafka.HeaderKey(r))
		return nil
	}, idemkafka.WithKey(idemkafka.HeaderKey), idemkafka.WithRetryDelay(100*time.Millisecond), idemkafka.WithLogger(slog.New(failed)))
	runConsumer(t, k, c, "park", kgo.MetadataMinAge(100*time.Millisecond))
	r0, r1, r2 := record(topic, "first", "1"), record(topic, "", "2"), record(topic, "next", "3")
	produce(t, k, r0, r1, r2)

	waitFor(t, "a failed park", 120*time.Second, func() bool { return failed.n.Load() >= 1 })
	waitFor(t, "the offset committed up to the record to park", 90*time.Second, func() bool {
		return committed(t, k, "park", topic, r1.Partition) == r1.Offset
	})
	more := failed.n.Load() + 2
	waitFor(t, "two more failed parks", 120*time.Second, func() bool { return failed.n.Load() >= more })
	if got := committed(t, k, "park", topic, r1.Partition); got != r1.Offset {
		t.Fatalf("committed offset %d while the dead-letter topic is missing; want %d, the record to park", got, r1.Offset)
	}
	if runs.of("first") != 1 || runs.of("next") != 0 {
		t.Fatalf("handler runs while the dead-letter topic is missing: first %d, next %d; want 1, 0", runs.of("first"), runs.of("next"))
	}

	cl := k.client()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = dlt(topic), 4, 3
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctxT(t, 30*time.Second), cl)
	cl.Close()
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("creating the dead-letter topic: %v", err)
	}
	waitFor(t, "the record after the parked one handled", 120*time.Second, func() bool { return runs.of("next") == 1 })
	dl := readDeadLetters(t, k, topic, 1)
	checkParked(t, dl[0], r1, idem.OutcomeKeyMissing, "")
	waitCommitted(t, k, "park", r2)
	t.Logf("%d park attempts failed before the topic was created", failed.n.Load())
}
