package outboxtest

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/adapters/idemkafka"
	"github.com/idemkit/idem/outbox"
)

// kafkaCluster is a kfake cluster (franz-go's Kafka written in Go, over
// TCP) of three brokers with its data on disk, restartable on its ports.
type kafkaCluster struct {
	t       testing.TB
	dir     string
	topic   string
	ports   []int
	c       *kfake.Cluster
	faulted atomic.Int64
}

func newKafkaCluster(t testing.TB, topic string) *kafkaCluster {
	k := &kafkaCluster{t: t, dir: t.TempDir(), topic: topic}
	k.start()
	t.Cleanup(func() { k.c.Close() })
	return k
}

// start starts the cluster from its data directory, on the ports of the
// previous start if any; a broker's listener drops its connections when
// the broker is removed ([dropConns]). One produce request in four is answered
// REQUEST_TIMED_OUT after the broker applied it: the client retries a
// batch the broker holds (its idempotent producer's sequence numbers make
// the broker drop the copy).
func (k *kafkaCluster) start() {
	opts := []kfake.Opt{kfake.NumBrokers(3), kfake.DataDir(k.dir), kfake.SeedTopics(4, k.topic, k.topic+idemkafka.DefaultDeadLetterSuffix), kfake.GroupMinSessionTimeout(500 * time.Millisecond), kfake.ListenFn(dropConns)}
	if k.ports != nil {
		opts = append(opts, kfake.Ports(k.ports...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		k.t.Fatal(err)
	}
	k.c = c
	if k.ports == nil {
		for _, a := range c.ListenAddrs() {
			_, p, _ := net.SplitHostPort(a)
			n, _ := strconv.Atoi(p)
			k.ports = append(k.ports, n)
		}
	}
	var n atomic.Int64
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.RequestTimedOut, Count: -1, When: func(kmsg.Request) bool {
		if n.Add(1)%4 == 0 {
			k.faulted.Add(1)
			return true
		}
		return false
	}})
}

// dropConns is kfake's listener function: a listener that, once closed,
// closes the connections it accepted too, as a stopped broker drops them.
// kfake's RemoveNode closes the node's listener only; kgo keeps the open
// connections to a node added back under its ID and port, and every
// request to it is answered NOT_LEADER_FOR_PARTITION for ever (the
// removed broker leads nothing). Same as examples/consumer's.
func dropConns(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return &dropListener{Listener: ln}, nil
}

type dropListener struct {
	net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func (l *dropListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	l.conns = append(l.conns, c)
	return c, nil
}

// Close stops accepting and closes the accepted connections.
func (l *dropListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
	return err
}

// addrs returns the brokers' addresses.
func (k *kafkaCluster) addrs() []string {
	addrs := make([]string, len(k.ports))
	for i, p := range k.ports {
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	return addrs
}

func (k *kafkaCluster) client(opts ...kgo.Opt) *kgo.Client {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.addrs()...)}, opts...)...)
	if err != nil {
		k.t.Fatal(err)
	}
	return cl
}

// consumeKafka runs fx's handler through idemkafka on topic until the
// test ends, counting records.
func consumeKafka(t testing.TB, k *kafkaCluster, fx *effects, records *atomic.Int64) {
	c := idemkafka.NewConsumer(fx.engine, "apply", func(ctx context.Context, r *kgo.Record) error {
		records.Add(1)
		return fx.apply(ctx, idemkafka.HeaderKey(r), r.Value)
	}, idemkafka.WithRetryDelay(100*time.Millisecond), idemkafka.WithLogger(quiet))
	cl := k.client(append(c.ClientOpts(), kgo.ConsumerGroup("fx"), kgo.ConsumeTopics(k.topic), kgo.SessionTimeout(3*time.Second), kgo.HeartbeatInterval(500*time.Millisecond))...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx, cl) }()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
}

// TestKafkaRelay relays payments committed through idem on PostgreSQL
// (pgstore.Tx, outbox.Pgx) to kfake under the relay kill matrix of
// TestChaosOutbox: relay processes SIGKILLed before a publish, after a
// publish before its ack, and between the ack and the sent mark; the
// cluster restarted from its data directory while two relays run; a
// partition moved and a broker removed and added back under load; one
// produce in four answered REQUEST_TIMED_OUT after being applied. Every
// committed payment must yield exactly one effect at idemkafka's
// consumer, none of a rolled-back one, and each ordering key's payments
// must be in the topic in enqueue order (first copies). A message is in
// the topic more than once only where README says: published again after
// a relay died between its publish and the sent mark (each message a
// kill left in the topic and unsent has a copy more), or after a publish
// that failed; the idempotent producer drops the copies of its own
// retries.
func TestKafkaRelay(t *testing.T) {
	n := 60
	if *soak {
		n = 600
	}
	rng := rand.New(rand.NewPCG(uint64(*seed), 43))
	db, pool := openDB(t, outbox.PostgreSQL)
	ob := newOutbox(t, db, outbox.PostgreSQL)
	topic := uniq("k")
	k := newKafkaCluster(t, topic)
	fx := newEffects(t, pool)
	var records atomic.Int64
	consumeKafka(t, k, fx, &records)
	prod := newProducer(t, pool, ob, topic)
	ctx := ctxT(t, 180*time.Second)
	for i := range n {
		if err := prod.pay(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	want := prod.committed()
	// Relay processes killed at each point, publishing one message at a
	// time; their publish timeout is a hang guard: no publish fails, and
	// each publish adds one copy. A copy a killed relay added to a message
	// it did not mark sent is one the next relay adds another after.
	logs := childLogs(t)
	env := []string{"OB_PG=" + pgURL(), "OB_TABLE=" + ob.Table(), "OB_KAFKA=" + strings.Join(k.addrs(), ","), "OB_BATCH=5", "OB_PUBLISH_TIMEOUT=2m"}
	left := map[string]int{} // message id -> copies the killed relays added with it unsent
	before := map[string]int{}
	for _, point := range []string{"before-publish", "after-publish", "after-confirm"} {
		r := startChild(t, logs, "relay", append(env, "OB_PAUSE="+point, "OB_PAUSE_AT="+strconv.Itoa(2+rng.IntN(8)))...)
		id := strings.TrimPrefix(r.waitLine(t, "pausing "), "pausing ")
		if point == "after-publish" { // the record reaches the broker; its ack, if any, never the relay
			waitFor(t, id+" in the topic", 60*time.Second, func() bool { return kafkaCopies(readKafka(t, k, topic))[id] > before[id] })
		}
		r.kill()
		copies := kafkaCopies(readKafka(t, k, topic))
		want := 1 // sent, or confirmed
		if point == "before-publish" {
			want = 0
		}
		if added := copies[id] - before[id]; added != want {
			t.Errorf("relay killed %s %s: it added %d copies of it to the topic, want %d", point, id, added, want)
		}
		unsentAdded := 0
		for _, id := range unsentIDs(t, db, ob.Table()) {
			left[id] += copies[id] - before[id]
			unsentAdded += copies[id] - before[id]
		}
		t.Logf("relay killed %s %s: %d copies it added are of messages unsent", point, id, unsentAdded)
		before = copies
	}
	// Two relays (the pipelined BatchPublisher) under the cluster's
	// restart, a partition move and a broker's removal.
	k.c.Close()
	var wg sync.WaitGroup
	rctx, stop := context.WithCancel(ctx)
	obs := &countingObserver{}
	for _, batch := range []int{7, 3} {
		cl := k.client()
		r, err := outbox.NewRelay(db, ob, idemkafka.NewPublisher(cl), outbox.WithLogger(quiet), outbox.WithObserver(obs), outbox.WithPollInterval(20*time.Millisecond),
			outbox.WithBackoff(50*time.Millisecond, time.Second), outbox.WithPublishTimeout(2*time.Second), outbox.WithBatchSize(batch), outbox.WithWorkers(2))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(rctx); cl.Close() })
	}
	time.Sleep(300 * time.Millisecond) // the relays fail and back off meanwhile
	k.start()
	if err := k.c.MoveTopicPartition(topic, 1, (k.c.LeaderFor(topic, 1)+1)%3); err != nil {
		t.Fatal(err)
	}
	if err := k.c.RemoveNode(2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := k.c.AddNode(2, k.ports[2]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an empty outbox", 120*time.Second, func() bool { return unsent(t, db, ob.Table()) == 0 })
	stop()
	wg.Wait()
	waitFor(t, "an effect per committed payment", 120*time.Second, func() bool { return len(fx.counts()) >= len(want) })
	recs := readKafka(t, k, topic)
	checkKafkaOrder(t, recs)
	fx.checkExactlyOnce(want)
	copies := kafkaCopies(recs)
	more, leftCopies := 0, 0
	for id, c := range copies {
		more += c - 1
		leftCopies += left[id]
		if c-1 < left[id] || c-1 > left[id]+obs.failures(id) {
			t.Errorf("message %s: %d copies in the topic; killed relays added %d with it unsent, %d publishes of it failed", id, c, left[id], obs.failures(id))
		}
	}
	t.Logf("%d payments, %d committed; relays killed at 3 points, cluster restarted, a partition moved, a broker removed and added back; "+
		"%d produces answered REQUEST_TIMED_OUT after being applied; %d records in the topic, %d copies more than one a message (%d left unsent by killed relays, %d publishes failed); %d handler runs, %d effects",
		n, len(want), k.faulted.Load(), len(recs), more, leftCopies, obs.failed.Load(), records.Load(), len(fx.counts()))
}

// unsentIDs returns the message ids of the outbox's unsent messages.
func unsentIDs(t testing.TB, db *sql.DB, table string) []string {
	rows, err := db.QueryContext(context.Background(), `SELECT msg_id FROM `+table+` WHERE sent_at IS NULL`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// kafkaCopies returns how many of recs carry each message id.
func kafkaCopies(recs []*kgo.Record) map[string]int {
	copies := map[string]int{}
	for _, r := range recs {
		copies[idemkafka.HeaderKey(r)]++
	}
	return copies
}

// readKafka reads topic from the start to its end offsets.
func readKafka(t testing.TB, k *kafkaCluster, topic string) []*kgo.Record {
	t.Helper()
	cl := k.client(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	ends := map[int32]int64{}
	ctx := ctxT(t, 60*time.Second)
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range int32(4) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	shards := cl.RequestSharded(ctx, req)
	for _, s := range shards {
		if s.Err != nil {
			t.Fatal(s.Err)
		}
		for _, tp := range s.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, p := range tp.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					t.Fatal(err)
				}
				ends[p.Partition] = p.Offset
			}
		}
	}
	total := 0
	for _, e := range ends {
		total += int(e)
	}
	var recs []*kgo.Record
	for len(recs) < total {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records: %v", len(recs), total, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Logf("fetch: %v", err) })
		recs = append(recs, fs.Records()...)
	}
	return recs
}

// checkKafkaOrder fails when an ordering key's payments (their first
// copies) are out of enqueue order in recs (a topic's records, in
// partition order), or a key's records are in more than one partition.
func checkKafkaOrder(t testing.TB, recs []*kgo.Record) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]string{}     // key -> last first-copy payment id
	partition := map[string]int32{} // key -> its partition
	for _, r := range recs {
		key, id := string(r.Key), idemkafka.HeaderKey(r)
		if p, ok := partition[key]; ok && p != r.Partition {
			t.Errorf("key %s in partitions %d and %d", key, p, r.Partition)
		}
		partition[key] = r.Partition
		if seen[id] {
			continue
		}
		seen[id] = true
		if prev := last[key]; prev != "" && strings.Compare(id, prev) < 0 {
			t.Errorf("key %s: %s after %s", key, id, prev)
		}
		last[key] = id
	}
}

// TestKafkaDeadLetter: a record whose key was used with another payload,
// and one without a key (idemkafka.HeaderKey), are produced to the
// dead-letter topic with the outcome in a header, and the records after
// them in their partition are handled: the partition is not blocked.
func TestKafkaDeadLetter(t *testing.T) {
	_, pool := openDB(t, outbox.PostgreSQL)
	topic := uniq("k")
	k := newKafkaCluster(t, topic)
	fx := newEffects(t, pool)
	c := idemkafka.NewConsumer(fx.engine, "apply", func(ctx context.Context, r *kgo.Record) error {
		return fx.apply(ctx, idemkafka.HeaderKey(r), r.Value)
	}, idemkafka.WithKey(idemkafka.HeaderKey), idemkafka.WithRetryDelay(100*time.Millisecond), idemkafka.WithLogger(quiet))
	cl := k.client(append(c.ClientOpts(), kgo.ConsumerGroup("fx"), kgo.ConsumeTopics(topic), kgo.SessionTimeout(3*time.Second))...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx, cl) }()
	defer func() { cancel(); <-done; cl.Close() }()
	rec := func(key, value string) *kgo.Record {
		r := &kgo.Record{Topic: topic, Key: []byte("customer1"), Value: []byte(value)}
		if key != "" {
			r.Headers = []kgo.RecordHeader{{Key: idemkafka.KeyHeader, Value: []byte(key)}}
		}
		return r
	}
	pcl := k.client()
	defer pcl.Close()
	// One record key: one partition, in this order.
	if err := pcl.ProduceSync(ctxT(t, 30*time.Second), rec("a", "1"), rec("a", "2"), rec("", "3"), rec("b", "4")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the effect of the record after the dead-lettered ones", 60*time.Second, func() bool { return fx.counts()["b"] == 1 })
	fx.checkExactlyOnce([]string{"a", "b"})
	dl := k.client(kgo.ConsumeTopics(topic+idemkafka.DefaultDeadLetterSuffix), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer dl.Close()
	var got []string
	rctx := ctxT(t, 60*time.Second)
	for len(got) < 2 && rctx.Err() == nil {
		dl.PollFetches(rctx).EachRecord(func(r *kgo.Record) {
			outcome := ""
			for _, h := range r.Headers {
				if h.Key == idemkafka.HeaderOutcome {
					outcome = string(h.Value)
				}
			}
			got = append(got, string(r.Value)+":"+outcome)
		})
	}
	if len(got) != 2 || got[0] != "2:key-reused" || !strings.HasPrefix(got[1], "3:") {
		t.Fatalf("dead-letter topic holds %q; want the reused key's record (2:key-reused) and the keyless one (3:...)", got)
	}
	t.Logf("dead-lettered: %q", got)
}
