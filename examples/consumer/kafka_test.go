package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/adapters/idemkafka"
)

// The Kafka chaos test runs the consumer processes against kfake (a Kafka
// written in Go, franz-go's pkg/kfake) started in the test process, three
// brokers, topic of 4 partitions, data directory on disk. Besides the
// kills of the NATS and RabbitMQ runs (mid-handler; between the record's
// commit and the offset commit request, held by -ack-delay), the broker
// plays: offset commits and produces answered REQUEST_TIMED_OUT after
// being applied (kfake faults, one request in three), the whole cluster
// restarted from its data directory, and a consumer joining the group
// mid-handler and leaving it; with -kafka-broker-faults also a partition
// moved to another broker and a broker removed and added back. Exactly N
// receipts with idem; more without.
func TestExactlyOnceKafka(t *testing.T) { testExactlyOnce(t, "kafka") }

// brokerFaults adds a partition move and a broker's removal to
// TestExactlyOnceKafka. Off by default: on kfake those runs stalled in some seeds (the test's
// own kgo producer waiting beyond its delivery timeout; consumers idle
// until the hang guard), which is not yet told apart from a kfake or kgo
// limit (README: kfake's gaps).
var brokerFaults = flag.Bool("kafka-broker-faults", false, "Kafka: also move a partition and remove and add back a broker during the kills")

// chaosKafka is chaos on Kafka: the payments are produced while the
// consumers run (a fifth at once, the rest one every 100ms, then the
// duplicates), so that work is left for every kill, and each kill takes
// whichever consumer prints its mark first.
func chaosKafka(t *testing.T, broker string, useIdem bool) (total, distinct int) {
	w := newWorld(t, broker)
	ps := samplePayments(*payments)
	first := max(1, len(ps)/5)
	w.send(ps[:first])
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i := first; i < len(ps); i++ {
			w.send(ps[i : i+1])
			time.Sleep(100 * time.Millisecond)
		}
		w.send(ps[:min(*duplicates, len(ps))])
	}()
	common := []string{"-idem=" + fmt.Sprint(useIdem), "-lease", "2s", "-store-timeout", "500ms", "-retry-delay", "200ms"}
	failing := append([]string{"-slow", "300ms", "-ack-delay", "200ms"}, common...)
	running := make([]*proc, instances)
	for i := range running {
		running[i] = w.start(failing...)
	}
	for k := range *kills {
		mark := "wrote " // mid-handler: the outbox row is written, not committed
		if k%2 == 1 {
			mark = "acking" // the record and the row are committed, the offset commit not sent
		}
		i := waitAny(t, running, mark)
		running[i].kill()
		running[i] = w.start(failing...)
		w.kafka.disrupt(w, k, func() *proc { return w.start(failing...) })
	}
	<-sent
	w.waitReceipts(*payments)
	for _, p := range running {
		p.stop()
	}
	w.drain(common...)
	total, distinct = w.count()
	t.Logf("kafka, idem %v: %d receipts for %d payments (%d produced twice, %d instances, %d kills; %v)",
		useIdem, total, distinct, *duplicates, instances, *kills, w.kafka)
	return total, distinct
}

// waitAny waits for the next line starting with prefix from any of ps and
// returns the index of the one that printed it.
func waitAny(t *testing.T, ps []*proc, prefix string) int {
	t.Helper()
	timeout := time.After(60 * time.Second) // a hang guard only
	for {
		for i, p := range ps {
			select {
			case l := <-p.lines:
				if strings.HasPrefix(l, prefix) {
					return i
				}
			case <-p.done:
				t.Fatalf("consumer exited before printing %q", prefix)
			default:
			}
		}
		select {
		case <-timeout:
			t.Fatalf("no consumer printed a %q line", prefix)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// kafkaWorld is the kfake cluster of one run.
type kafkaWorld struct {
	t          *testing.T
	dir        string
	ports      []int
	cluster    atomic.Pointer[kfake.Cluster]
	topic      string
	mu         sync.Mutex
	cl         *kgo.Client // the test's producer and admin client
	faulted    atomic.Int64
	reproduced atomic.Int64 // payments produced again after a failed produce
	lastLag    []string     // the partitions' offsets at the last lag
}

const kafkaPartitions = 4

func newKafka(t *testing.T, topic string) *kafkaWorld {
	k := &kafkaWorld{t: t, dir: t.TempDir(), topic: topic}
	k.start()
	t.Cleanup(func() { k.cluster.Load().Close() })
	k.cl = k.newClient()
	t.Cleanup(func() { k.producer().Close() })
	return k
}

// start starts the cluster from its data directory, on the ports of the
// previous start if any (the consumers' seed brokers).
func (k *kafkaWorld) start() {
	opts := []kfake.Opt{
		kfake.NumBrokers(3), kfake.DataDir(k.dir), kfake.SeedTopics(kafkaPartitions, k.topic, k.topic+idemkafka.DefaultDeadLetterSuffix),
		kfake.GroupMinSessionTimeout(500 * time.Millisecond),
	}
	if k.ports != nil {
		opts = append(opts, kfake.Ports(k.ports...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		k.t.Fatal(err)
	}
	k.cluster.Store(c)
	if k.ports == nil {
		for _, a := range c.ListenAddrs() {
			_, p, _ := net.SplitHostPort(a)
			n, _ := strconv.Atoi(p)
			k.ports = append(k.ports, n)
		}
	}
	k.faults(c)
}

// faults makes one offset commit and one produce in three be answered
// REQUEST_TIMED_OUT after the broker applied it: the client sees a
// failure (and retries) for what took effect.
func (k *kafkaWorld) faults(c *kfake.Cluster) {
	var n atomic.Int64
	c.Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.OffsetCommit, kmsg.Produce}, Err: kerr.RequestTimedOut, Count: -1,
		When: func(kmsg.Request) bool {
			if n.Add(1)%3 == 0 {
				k.faulted.Add(1)
				return true
			}
			return false
		},
	})
}

func (k *kafkaWorld) addrs() []string {
	a := make([]string, len(k.ports))
	for i, p := range k.ports {
		a[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	return a
}

// args are the consumer's flags for this cluster.
func (k *kafkaWorld) args() []string {
	return []string{"-kafka", strings.Join(k.addrs(), ","), "-kafka-session", "2s"}
}

// send produces the payments, keyed by email, with their id in the
// Idempotency-Key header. A produce not acked within 10s is produced
// again on a new client, as an application would (a copy is a duplicate
// the header absorbs): under these faults kgo's producer was seen to
// wait beyond its RecordDeliveryTimeout.
func (k *kafkaWorld) send(ps []Payment) {
	ctx := ctxT(k.t)
	for _, p := range ps {
		b, _ := json.Marshal(p)
		for {
			r := &kgo.Record{Topic: k.topic, Key: []byte(p.Email), Value: b, Headers: []kgo.RecordHeader{{Key: idemkafka.KeyHeader, Value: []byte(p.ID)}}}
			acked := make(chan error, 1)
			cl := k.producer()
			cl.Produce(ctx, r, func(_ *kgo.Record, err error) { acked <- err })
			var err error
			select {
			case err = <-acked:
			case <-time.After(10 * time.Second):
				err = errors.New("no ack in 10s")
				k.replaceProducer(cl)
			}
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				k.t.Errorf("produce %s: %v", p.ID, err)
				return
			}
			k.reproduced.Add(1)
		}
	}
}

func (k *kafkaWorld) producer() *kgo.Client {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cl
}

// replaceProducer closes cl (failing its records) and opens a new one.
func (k *kafkaWorld) replaceProducer(cl *kgo.Client) {
	cl.Close()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cl = k.newClient()
}

func (k *kafkaWorld) newClient() *kgo.Client {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addrs()...))
	if err != nil {
		k.t.Fatal(err)
	}
	return cl
}

// disrupt plays the broker's failure number i (of the kills loop), while
// the consumers run.
func (k *kafkaWorld) disrupt(w *world, i int, start func() *proc) {
	c := k.cluster.Load()
	if !*brokerFaults && i%4 < 2 {
		return
	}
	switch i % 4 {
	case 0: // a partition moved to another broker
		p := int32(i % kafkaPartitions)
		to := (c.LeaderFor(k.topic, p) + 1) % 3
		if err := c.MoveTopicPartition(k.topic, p, to); err != nil {
			k.t.Fatal(err)
		}
	case 1: // a broker removed, then added back on its port
		node := int32(i % 3)
		if err := c.RemoveNode(node); err != nil {
			k.t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // the clients see it gone (no assertion rests on it)
		if _, _, err := c.AddNode(node, k.ports[node]); err != nil {
			k.t.Fatal(err)
		}
	case 2: // the cluster restarted from its data directory
		c.Close()
		k.start()
	case 3: // a consumer joins mid-handler, then leaves
		p := start()
		select { // mid-handler if it was given a partition with work left
		case <-waitPrefix(p, "wrote "):
		case <-time.After(5 * time.Second):
		}
		p.stop()
	}
}

// lag returns the records of the topic not committed by the group.
func (k *kafkaWorld) lag() int64 {
	cl := k.newClient() // fresh metadata: a partition moved or a broker re-added
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := ctxT(k.t)
	ends, err := adm.ListEndOffsets(ctx, k.topic)
	if err != nil {
		k.t.Fatal(err)
	}
	committed, err := adm.FetchOffsets(ctx, "receipts")
	if err != nil {
		k.t.Fatal(err)
	}
	var lag int64
	k.lastLag = nil
	ends.Each(func(o kadm.ListedOffset) {
		c, ok := committed.Lookup(o.Topic, o.Partition)
		switch {
		case o.Err != nil: // e.g. its leader moving: not known yet
			lag++
		case !ok || c.At < 0:
			lag += o.Offset
		default:
			lag += o.Offset - c.At
		}
		k.lastLag = append(k.lastLag, fmt.Sprintf("%s/%d end %d committed %d (%v)", o.Topic, o.Partition, o.Offset, c.At, ok))
	})
	return lag
}

// String names the cluster's faults for the run's log.
func (k *kafkaWorld) String() string {
	return fmt.Sprintf("kfake: 3 brokers, %d requests answered REQUEST_TIMED_OUT after being applied, %d payments produced again", k.faulted.Load(), k.reproduced.Load())
}

// waitPrefix returns a channel closed once p prints a line starting with
// prefix or exits.
func waitPrefix(p *proc, prefix string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case l := <-p.lines:
				if strings.HasPrefix(l, prefix) {
					return
				}
			case <-p.done:
				return
			}
		}
	}()
	return done
}

// drained waits until the group committed every record's offset.
func (k *kafkaWorld) drained() {
	deadline := time.Now().Add(90 * time.Second) // a hang guard only
	for k.lag() != 0 {
		if time.Now().After(deadline) {
			k.t.Fatalf("gave up waiting for every record's offset committed: %s", strings.Join(k.lastLag, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRelayedKafka runs the command as documented (-publish, no -kafka):
// kfake in its own process, payments relayed to it and consumed with
// idem: one receipt each.
func TestRelayedKafka(t *testing.T) {
	w := newWorld(t, "") // the tables only: the command starts its own kfake
	t.Cleanup(func() {
		for _, table := range []string{w.name + "_events", w.name + "_events_partitions", w.name + "_payments"} {
			_, _ = w.pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{table}.Sanitize())
		}
	})
	out, err := exec.Command(bin, "-broker", "kafka", "-name", w.name, "-publish", "5").CombinedOutput()
	if err != nil {
		t.Fatalf("consumer -broker kafka -publish 5: %v\n%s", err, out)
	}
	if total, distinct := w.count(); total != 5 || distinct != 5 {
		t.Fatalf("%d receipts for %d payments, want 5 for 5\n%s", total, distinct, out)
	}
}
