package outboxtest

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/adapters/idemamqp"
	"github.com/idemkit/idem/adapters/idemnats"
	"github.com/idemkit/idem/outbox"
)

// outage plays the faults of a broker outage on px, in order: bytes
// dropped with the connections open for hold, the connections closed and
// refused for hold, then everything restored.
func outage(px *faultProxy, hold time.Duration) {
	px.drop()
	time.Sleep(hold)
	px.close()
	time.Sleep(hold)
	px.restore()
}

// brokerSide is a broker for the outage tests: a publisher connected
// through a fault proxy, and idem's consumer helper applying what arrives,
// connected directly.
type brokerSide struct {
	pub     outbox.BatchPublisher
	px      *faultProxy
	subject string
	fx      *effects
}

func newBrokerSide(t *testing.T, broker string) *brokerSide {
	t.Helper()
	_, pool := openDB(t, outbox.PostgreSQL)
	switch broker {
	case "amqp":
		w := newAMQPWorld(t)
		px := newFaultProxy(t, amqpHost(t))
		pub := idemamqp.NewPublisher(func() (*amqp.Connection, error) { return amqp.Dial(amqpViaProxy(t, px.addr())) }, "")
		t.Cleanup(func() { _ = pub.Close() })
		return &brokerSide{pub: pub, px: px, subject: w.queue, fx: w.fx}
	default:
		nodes := startNATS(t, 1)
		_, js := connect(t, urls(nodes))
		name := "LIVE" + strconv.Itoa(freePort(t))
		s := createStream(t, js, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage})
		fx := newEffects(t, pool)
		consumeNATS(t, s, fx.natsHandler())
		px := newFaultProxy(t, nodes[0].url()[len("nats://"):])
		_, pjs := connect(t, "nats://"+px.addr())
		return &brokerSide{pub: idemnats.NewPublisher(pjs), px: px, subject: name + ".payment.created", fx: fx}
	}
}

// TestPublisherOutage publishes through a fault proxy: one message; then
// the proxy drops bytes with the connections open, a batch with a 5s
// deadline starts, 0.5s later the proxy closes the connections and 0.5s
// later comes back. The batch
// returns (a hang guard of 60s, far above its deadline: the publisher
// must not wait past it), and so does a call made behind it with a 1s
// deadline; the messages they did not confirm are
// published again, each call with a 3s deadline, as the relay does: every
// message reaches the consumer once. A publisher stuck on a closed
// notification channel never returns and spins (the goroutine check of
// TestMain fails too).
func TestPublisherOutage(t *testing.T) {
	for _, broker := range []string{"amqp", "nats"} {
		t.Run(broker, func(t *testing.T) {
			b := newBrokerSide(t, broker)
			ids := paymentIDs(5)
			msg := func(id string) outbox.Message {
				return outbox.Message{ID: id, Key: id, Subject: b.subject, Payload: []byte(id)}
			}
			publish := func(m outbox.Message, deadline time.Duration) error {
				t.Helper()
				done := make(chan error, 1)
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					defer cancel()
					done <- b.pub.Publish(ctx, m)
				}()
				select {
				case err := <-done:
					return err
				case <-time.After(deadline + 60*time.Second):
					t.Fatalf("Publish with a %v deadline has not returned after %v", deadline, deadline+60*time.Second)
					return nil
				}
			}
			if err := publish(msg(ids[0]), 30*time.Second); err != nil {
				t.Fatalf("Publish before the outage: %v", err)
			}
			batch := []outbox.Message{msg(ids[1]), msg(ids[2])}
			done := make(chan []error, 1)
			b.px.drop()
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				done <- b.pub.PublishBatch(ctx, batch)
			}()
			// A call behind the batch (most often: goroutines start in no
			// set order) returns by its own 1s deadline, not the batch's.
			queued := make(chan error, 1)
			time.Sleep(100 * time.Millisecond)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				queued <- b.pub.Publish(ctx, msg(ids[4]))
			}()
			time.Sleep(400 * time.Millisecond) // the batch is sent into the dropped bytes
			b.px.close()
			time.Sleep(500 * time.Millisecond)
			b.px.restore()
			var errs []error
			select {
			case errs = <-done:
			case <-time.After(65 * time.Second):
				t.Fatal("PublishBatch with a 5s deadline has not returned 60s after it")
			}
			again := []outbox.Message{msg(ids[3]), msg(ids[4])}
			select {
			case err := <-queued:
				t.Logf("Publish behind the batch: %v", err)
			case <-time.After(60 * time.Second):
				t.Fatal("Publish with a 1s deadline, behind the batch, has not returned after 60s")
			}
			for i, err := range errs {
				t.Logf("PublishBatch during the outage: %s: %v", batch[i].ID, err)
				if err != nil {
					again = append(again, batch[i])
				}
			}
			for _, m := range again {
				var err error
				for range 20 { // a relay's retries; each call within its deadline
					if err = publish(m, 3*time.Second); err == nil {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				if err != nil {
					t.Fatalf("Publish after the outage: %v", err)
				}
			}
			waitFor(t, "an effect per message", 60*time.Second, func() bool { return len(b.fx.counts()) == len(ids) })
			b.fx.checkExactlyOnce(ids)
		})
	}
}

// TestRelayBrokerOutage relays a stream of committed messages (one writer,
// every 10ms) from PostgreSQL through a fault proxy to the broker while
// the proxy drops bytes with the connections open (1.5s), closes them
// (1.5s) and comes back, in the middle of the relay's batches. The relay
// publishes again after the outage (within its backoff of at most 1s
// plus one publish timeout of 2s; hang guards of 60s), drains the outbox,
// and stops when asked; every committed message reaches the consumer
// exactly once.
func TestRelayBrokerOutage(t *testing.T) {
	for _, broker := range []string{"amqp", "nats"} {
		t.Run(broker, func(t *testing.T) {
			b := newBrokerSide(t, broker)
			db, _ := openDB(t, outbox.PostgreSQL)
			ob := newOutbox(t, db, outbox.PostgreSQL, outbox.WithPartitions(4))
			obs := &countingObserver{}
			r, err := outbox.NewRelay(db, ob, b.pub, outbox.WithWorkers(2), outbox.WithBatchSize(20), outbox.WithObserver(obs),
				outbox.WithPollInterval(20*time.Millisecond), outbox.WithBackoff(50*time.Millisecond, time.Second),
				outbox.WithPublishTimeout(2*time.Second), outbox.WithLogger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			relayed := make(chan error, 1)
			go func() { relayed <- r.Run(ctx) }()
			stopRelay := func() {
				cancel()
				select {
				case err := <-relayed:
					if err != nil {
						t.Error(err)
					}
				case <-time.After(60 * time.Second):
					t.Fatal("Relay.Run did not return 60s after its context was cancelled")
				}
			}
			w := startWriter(t, db, ob, b.subject)
			waitFor(t, "the relay publishing", 60*time.Second, func() bool { return obs.published.Load() >= 20 })
			outage(b.px, 1500*time.Millisecond)
			after := obs.published.Load()
			waitFor(t, "the relay publishing again after the outage", 60*time.Second, func() bool { return obs.published.Load() > after+20 })
			want := w.stop()
			waitFor(t, "an empty outbox", 60*time.Second, func() bool { return unsent(t, db, ob.Table()) == 0 })
			stopRelay()
			waitFor(t, "an effect per committed message", 60*time.Second, func() bool { return len(b.fx.counts()) == len(want) })
			b.fx.checkExactlyOnce(want)
			t.Logf("%d messages committed; %d publishes confirmed, %d failed (during the outage)", len(want), obs.published.Load(), obs.failed.Load())
		})
	}
}

// countingObserver counts the relay's confirmed and failed publishes, and
// the failed ones of each message.
type countingObserver struct {
	published, failed atomic.Int64
	mu                sync.Mutex
	failedOf          map[string]int // message id -> failed publishes
}

func (c *countingObserver) Published(context.Context, outbox.Message, time.Duration) {
	c.published.Add(1)
}

func (c *countingObserver) PublishFailed(_ context.Context, m outbox.Message, _ error) {
	c.failed.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failedOf == nil {
		c.failedOf = map[string]int{}
	}
	c.failedOf[m.ID]++
}

// failures returns how many publishes of message id failed.
func (c *countingObserver) failures(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failedOf[id]
}

func (c *countingObserver) Pending(context.Context, int64, time.Duration) {}

// writer commits one message every 10ms (keys over 7 customers, each
// in its own transaction) until stopped.
type writer struct {
	t         testing.TB
	cancel    context.CancelFunc
	done      chan struct{}
	committed []string
}

func startWriter(t testing.TB, db *sql.DB, ob *outbox.Outbox, subject string) *writer {
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{t: t, cancel: cancel, done: make(chan struct{})}
	stamp := paymentIDs(1)[0]
	go func() {
		defer close(w.done)
		for i := 0; ctx.Err() == nil; i++ {
			id := fmt.Sprintf("%s_%06d", stamp, i)
			m := outbox.Message{ID: id, Key: "customer" + strconv.Itoa(i%7), Subject: subject, Payload: []byte(id)}
			if err := ob.Enqueue(context.Background(), db, m); err != nil {
				t.Errorf("enqueue: %v", err)
				return
			}
			w.committed = append(w.committed, id)
			sleep(ctx, 10*time.Millisecond)
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// stop stops the writer and returns the ids it committed.
func (w *writer) stop() []string {
	w.cancel()
	<-w.done
	return w.committed
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
