package outboxtest

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/adapters/idemkafka"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/outbox"
)

// TestKafkaRevokeWaits: a partition revoked while idemkafka's consumer
// runs its handler is handed over only once the handler returned and its
// offset is committed. Consumer A takes both partitions of a topic and
// blocks in a record's handler in each; consumer B joins the group (same
// operation, same keys: another process of the service), and A's handlers
// are released once kgo calls A's OnPartitionsRevoked for a partition
// whose handler runs. Checked by the order of events, not by time:
// OnPartitionsRevoked returns only after the handlers of the partitions it
// revokes returned; B never attempts a record (its key function) while
// A's handler runs it; every record's handler runs once in all; B handles
// the records after the blocked one in a partition it took over. With
// kgo's default cooperative-sticky balancer, an eager one (range) and the
// broker-side balancer of KIP-848.
func TestKafkaRevokeWaits(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []kgo.Opt
	}{
		{"cooperative", nil},
		{"eager", []kgo.Opt{kgo.Balancers(kgo.RangeBalancer())}},
		{"kip848", []kgo.Opt{kgo.Balancers(kgo.RangeBalancer()), kgo.ServerSideBalancer()}},
	} {
		t.Run(tc.name, func(t *testing.T) { testRevokeWaits(t, tc.opts) })
	}
}

// revokeGrace is how long A's handlers stay blocked after A's
// OnPartitionsRevoked is entered, unless it returns first (it must not):
// an adapter that does not wait returns at once, and is caught.
const revokeGrace = 2 * time.Second

func testRevokeWaits(t *testing.T, balance []kgo.Opt) {
	_, pool := openDB(t, outbox.PostgreSQL)
	topic := uniq("k")
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic), kfake.GroupMinSessionTimeout(500*time.Millisecond),
		kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": "500"})) // KIP-848's, 5s by default
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	_, port, _ := net.SplitHostPort(c.ListenAddrs()[0])
	n, _ := strconv.Atoi(port)
	k := &kafkaCluster{t: t, topic: topic, c: c, ports: []int{n}}
	store, eA := newParkStore(t, pool)
	eB, err := idem.New(store, idem.WithLogger(quiet)) // B's engine: another process's, on the same store
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eB.Close(context.Background()) })

	pcl := k.client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	t.Cleanup(pcl.Close)
	var recs []*kgo.Record // produced, in order
	last := map[int32]*kgo.Record{}
	produceRound := func() { // a record in each partition
		rs := []*kgo.Record{{Topic: topic, Partition: 0, Value: []byte("v")}, {Topic: topic, Partition: 1, Value: []byte("v")}}
		if err := pcl.ProduceSync(ctxT(t, 60*time.Second), rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rs...)
		last[0], last[1] = rs[0], rs[1]
	}

	h := &handover{entered: map[string]int{}, returned: map[string]int{}, runs: map[string]int{}, byB: map[string]bool{}, triedB: map[string]int{}}
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	revoking := make(chan struct{}) // closed once A's OnPartitionsRevoked is entered with a handler running
	revoked := make(chan struct{})  // closed once that call returned
	early := make(chan struct{})    // closed once B attempted a record A's handler runs
	var once, onceDone, onceEarly sync.Once

	// A's handler blocks until released in the records of a poll that
	// holds both partitions (the adapter polls again only once all of a
	// poll's records are handled), and returns at once in the others.
	polled := &pollParts{}
	a := idemkafka.NewConsumer(eA, "apply", func(ctx context.Context, r *kgo.Record) error {
		pos := idemkafka.PositionKey(r)
		block := polled.both()
		h.do(func(seq int) {
			h.runs[pos]++
			if block {
				h.entered[pos] = seq
			}
		})
		if !block {
			return nil
		}
		defer h.do(func(seq int) { h.returned[pos] = seq })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, idemkafka.WithRetryDelay(100*time.Millisecond), idemkafka.WithLogger(quiet))
	inner := revokeOf(t, k, a)
	onRevoked := func(ctx context.Context, cl *kgo.Client, parts map[string][]int32) {
		var busy []string // positions whose handler runs in A
		h.do(func(int) {
			for _, pos := range h.running() {
				if slices.Contains(parts[topic], partitionOf(pos)) {
					busy = append(busy, pos)
				}
			}
		})
		if len(busy) > 0 {
			once.Do(func() { h.busy = busy; close(revoking) })
		}
		inner(ctx, cl, parts)
		h.do(func(int) {
			for _, pos := range busy {
				if _, done := h.returned[pos]; !done {
					t.Errorf("A's OnPartitionsRevoked(%v) returned while A's handler of record %s ran: the partition is handed over mid-handler", parts, pos)
				}
			}
		})
		if len(busy) > 0 {
			onceDone.Do(func() { close(revoked) })
		}
	}
	groupOpts := append(slices.Clone(balance), kgo.SessionTimeout(30*time.Second), kgo.HeartbeatInterval(500*time.Millisecond))
	runConsumer(t, k, a, "revoke", append(slices.Clone(groupOpts), kgo.OnPartitionsRevoked(onRevoked), kgo.WithHooks(polled))...)
	t.Cleanup(unblock) // before A's Run is stopped
	produceRound()
	waitFor(t, "A's handler blocked in both partitions", 120*time.Second, func() bool {
		var blocked, runs int
		h.do(func(int) {
			blocked = len(h.running())
			for _, n := range h.runs {
				runs += n
			}
		})
		if blocked == 0 && runs == len(recs) { // polled apart and handled: again
			produceRound()
		}
		return blocked == 2
	})
	produceRound() // records after the blocked ones

	b := idemkafka.NewConsumer(eB, "apply", func(_ context.Context, r *kgo.Record) error {
		pos := idemkafka.PositionKey(r)
		h.do(func(int) { h.runs[pos]++; h.byB[pos] = true })
		return nil
	}, idemkafka.WithKey(func(r *kgo.Record) string {
		pos := idemkafka.PositionKey(r)
		h.do(func(seq int) {
			if _, ok := h.triedB[pos]; !ok {
				h.triedB[pos] = seq
			}
			if _, in := h.entered[pos]; in {
				if _, done := h.returned[pos]; !done {
					t.Errorf("B attempted record %s while A's handler ran it", pos)
					onceEarly.Do(func() { close(early) })
				}
			}
		})
		return idemkafka.PositionKey(r)
	}), idemkafka.WithRetryDelay(100*time.Millisecond), idemkafka.WithLogger(quiet))
	runConsumer(t, k, b, "revoke", groupOpts...)

	select {
	case <-revoking:
	case <-ctxT(t, 120*time.Second).Done():
		t.Fatal("A's OnPartitionsRevoked was never called for a partition whose handler runs")
	}
	grace := time.NewTimer(revokeGrace)
	select {
	case <-revoked: // too early (reported): A's handlers stay blocked until B runs into one, as a user's would
		select {
		case <-early:
		case <-grace.C:
		}
	case <-grace.C:
	}
	grace.Stop()
	unblock()

	waitCommitted(t, k, "revoke", last[0])
	waitCommitted(t, k, "revoke", last[1])
	h.do(func(int) {
		for _, r := range recs {
			pos := idemkafka.PositionKey(r)
			if h.runs[pos] != 1 {
				t.Errorf("record %s: the handler ran %d times in all; want 1", pos, h.runs[pos])
			}
		}
		tookOver := false
		for _, busy := range h.busy {
			for _, r := range recs {
				tookOver = tookOver || r.Partition == partitionOf(busy) && r.Offset > offsetOf(busy) && h.byB[idemkafka.PositionKey(r)]
			}
		}
		if !tookOver {
			t.Errorf("B handled no record after one whose handler ran in A when its partition was revoked (%v)", h.busy)
		}
		t.Logf("%d records; revoked mid-handler in A: %v; sequence numbers of A's blocked handlers returned %v, of B's first attempts %v", len(recs), h.busy, h.returned, h.triedB)
	})
}

// handover is the history of TestKafkaRevokeWaits: each event takes the
// next sequence number under mu.
type handover struct {
	mu       sync.Mutex
	seq      int
	entered  map[string]int  // position -> A's handler entered
	returned map[string]int  // position -> A's handler returned
	runs     map[string]int  // position -> handler runs, A's and B's
	byB      map[string]bool // position -> B ran its handler
	triedB   map[string]int  // position -> B's first attempt (key function)
	busy     []string        // positions whose handler ran in A when OnPartitionsRevoked was entered
}

func (h *handover) do(fn func(seq int)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	fn(h.seq)
}

// running returns the positions whose handler runs in A (entered, not
// returned); h.mu is held.
func (h *handover) running() []string {
	var pos []string
	for p := range h.entered {
		if _, done := h.returned[p]; !done {
			pos = append(pos, p)
		}
	}
	return pos
}

// partitionOf and offsetOf return the partition and offset of a position
// key ("<partition>/<offset>", [idemkafka.PositionKey]).
func partitionOf(pos string) int32 {
	p, _, _ := strings.Cut(pos, "/")
	n, _ := strconv.ParseInt(p, 10, 32)
	return int32(n)
}

func offsetOf(pos string) int64 {
	_, o, _ := strings.Cut(pos, "/")
	n, _ := strconv.ParseInt(o, 10, 64)
	return n
}

// pollParts is a kgo hook noting which partitions the client's latest
// poll returned records of: kgo calls OnPollStart as a poll begins and
// OnFetchRecordUnbuffered for each record the poll returns, before it
// returns.
type pollParts struct {
	mu    sync.Mutex
	parts map[int32]bool
}

func (p *pollParts) OnPollStart(context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.parts = map[int32]bool{}
}

func (p *pollParts) OnFetchRecordUnbuffered(r *kgo.Record, polled bool) {
	if !polled {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.parts[r.Partition] = true
}

// both says whether the latest poll returned records of partitions 0 and 1.
func (p *pollParts) both() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.parts[0] && p.parts[1]
}

// revokeOf returns the OnPartitionsRevoked function c's ClientOpts set,
// read from a client that joins no group (kgo keeps one such function: a
// test wrapping it sets its own after reading it).
func revokeOf(t *testing.T, k *kafkaCluster, c *idemkafka.Consumer) func(context.Context, *kgo.Client, map[string][]int32) {
	t.Helper()
	cl := k.client(append(c.ClientOpts(), kgo.ConsumerGroup("probe"))...)
	defer cl.Close()
	fn, ok := cl.OptValue(kgo.OnPartitionsRevoked).(func(context.Context, *kgo.Client, map[string][]int32))
	if !ok || fn == nil {
		t.Fatal("idemkafka's ClientOpts set no OnPartitionsRevoked")
	}
	return fn
}
