package outboxtest

import (
	"context"
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
// previous start if any. One produce request in four is answered
// REQUEST_TIMED_OUT after the broker applied it: the client retries a
// batch the broker holds (its idempotent producer's sequence numbers make
// the broker drop the copy).
func (k *kafkaCluster) start() {
	opts := []kfake.Opt{kfake.NumBrokers(3), kfake.DataDir(k.dir), kfake.SeedTopics(4, k.topic, k.topic+idemkafka.DefaultDeadLetterSuffix), kfake.GroupMinSessionTimeout(500 * time.Millisecond)}
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

func (k *kafkaCluster) client(opts ...kgo.Opt) *kgo.Client {
	addrs := make([]string, len(k.ports))
	for i, p := range k.ports {
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
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

// killablePublisher is a relay's publisher that, at its at-th message,
// does what point says and then hangs until its relay is "killed"
// (its context cancelled: the relay's transaction rolls back, nothing is
// marked sent, as when its process dies): before-publish; after-publish
// (the record sent, its ack not awaited); after-confirm (the ack
// received, the sent mark not committed).
type killablePublisher struct {
	inner  *idemkafka.Publisher
	cl     *kgo.Client
	point  string
	at     int64
	n      atomic.Int64
	paused chan struct{}
}

func (p *killablePublisher) Publish(ctx context.Context, m outbox.Message) error {
	if p.n.Add(1) != p.at {
		return p.inner.Publish(ctx, m)
	}
	switch p.point {
	case "after-publish":
		r := &kgo.Record{Topic: m.Subject, Key: []byte(m.Key), Value: m.Payload, Headers: []kgo.RecordHeader{{Key: idemkafka.KeyHeader, Value: []byte(m.ID)}}}
		p.cl.Produce(context.WithoutCancel(ctx), r, nil)
		time.Sleep(50 * time.Millisecond) // on the wire, or not yet: either is a kill's outcome
	case "after-confirm":
		if err := p.inner.Publish(ctx, m); err != nil {
			return err
		}
	}
	close(p.paused)
	<-ctx.Done()
	return ctx.Err()
}

// TestKafkaRelay relays payments committed through idem on PostgreSQL
// (pgstore.Tx, outbox.Pgx) to kfake under the relay kill matrix of
// TestChaosOutbox: relays killed before a publish, after a publish before
// its ack, and between the ack and the sent mark; the cluster restarted
// from its data directory while two relays run; a partition moved and a
// broker removed and added back under load; one produce in four answered
// REQUEST_TIMED_OUT after being applied. Every committed payment must
// yield exactly one effect at idemkafka's consumer, none of a rolled-back
// one, and each ordering key's payments must be in the topic in enqueue
// order (first copies; a re-publish adds later copies).
func TestKafkaRelay(t *testing.T) {
	n := 60
	if *soak {
		n = 600
	}
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
	relayOpts := []outbox.RelayOption{outbox.WithLogger(quiet), outbox.WithPollInterval(20 * time.Millisecond),
		outbox.WithBackoff(50*time.Millisecond, time.Second), outbox.WithPublishTimeout(2 * time.Second)}
	for i, point := range []string{"before-publish", "after-publish", "after-confirm"} {
		cl := k.client()
		pub := &killablePublisher{inner: idemkafka.NewPublisher(cl), cl: cl, point: point, at: int64(3 + 2*i), paused: make(chan struct{})}
		r, err := outbox.NewRelay(db, ob, pub, append(relayOpts, outbox.WithBatchSize(5))...)
		if err != nil {
			t.Fatal(err)
		}
		rctx, kill := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(rctx) }()
		select {
		case <-pub.paused:
		case <-ctx.Done():
			t.Fatalf("relay never reached %s", point)
		}
		kill()
		<-done
		cl.Close()
	}
	// Two relays (the pipelined BatchPublisher) under the cluster's
	// restart, a partition move and a broker's removal.
	k.c.Close()
	var wg sync.WaitGroup
	rctx, stop := context.WithCancel(ctx)
	for _, batch := range []int{7, 3} {
		cl := k.client()
		r, err := outbox.NewRelay(db, ob, idemkafka.NewPublisher(cl), append(relayOpts, outbox.WithBatchSize(batch), outbox.WithWorkers(2))...)
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
	stored := checkKafkaOrder(t, k, topic)
	fx.checkExactlyOnce(want)
	if stored < len(want) {
		t.Errorf("the topic holds %d records for %d committed payments", stored, len(want))
	}
	t.Logf("%d payments, %d committed; relays killed at 3 points, cluster restarted, a partition moved, a broker removed and added back; "+
		"%d produces answered REQUEST_TIMED_OUT after being applied; %d records in the topic, %d handler runs, %d effects",
		n, len(want), k.faulted.Load(), stored, records.Load(), len(fx.counts()))
}

// checkKafkaOrder reads topic from the start and fails when an ordering
// key's payments (their first copies) are out of enqueue order, or a
// key's records are in more than one partition; it returns how many
// records the topic holds.
func checkKafkaOrder(t testing.TB, k *kafkaCluster, topic string) int {
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
	seen := map[string]bool{}
	last := map[string]string{}     // key -> last first-copy payment id
	partition := map[string]int32{} // key -> its partition
	read := 0
	for read < total {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records: %v", read, total, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Logf("fetch: %v", err) })
		fs.EachRecord(func(r *kgo.Record) {
			read++
			key, id := string(r.Key), idemkafka.HeaderKey(r)
			if p, ok := partition[key]; ok && p != r.Partition {
				t.Errorf("key %s in partitions %d and %d", key, p, r.Partition)
			}
			partition[key] = r.Partition
			if seen[id] {
				return
			}
			seen[id] = true
			if prev := last[key]; prev != "" && strings.Compare(id, prev) < 0 {
				t.Errorf("key %s: %s after %s", key, id, prev)
			}
			last[key] = id
		})
	}
	return total
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
