package idemamqp_test

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/idemamqp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

func amqpURL() string {
	if u := os.Getenv("IDEM_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newQueue connects to RabbitMQ (failing when it does not answer) and
// declares a queue of its own, deleted at the end of the test.
func newQueue(t *testing.T) (*amqp.Connection, *amqp.Channel, string) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		t.Fatalf("RabbitMQ at %s: %v (scripts/services.sh starts one)", amqpURL(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("idemtest-"+rand.Text()[:10], true, false, false, false, nil) // durable: RabbitMQ 4.3 refuses transient non-exclusive queues
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q.Name, false, false, false)
			_ = ch.Close()
		}
	})
	return conn, ch, q.Name
}

func publish(t *testing.T, ch *amqp.Channel, queue, id, body string) {
	t.Helper()
	if err := ch.PublishWithContext(ctxT(t), "", queue, false, false, amqp.Publishing{MessageId: id, Body: []byte(body)}); err != nil {
		t.Fatal(err)
	}
}

type runs struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *runs) add(k string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[k]++
	return r.n[k]
}

func (r *runs) get(k string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[k]
}

func TestHandler(t *testing.T) {
	conn, pub, queue := newQueue(t)
	s := memstore.New()
	e, err := idem.New(s, idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer func() { _ = e.Close(context.Background()) }()

	var r runs
	h := idemamqp.Handler(e, "send-receipt", func(ctx context.Context, d amqp.Delivery) error {
		if _, ok := idem.InfoFromContext(ctx); !ok {
			t.Error("handler context without the execution")
		}
		n := r.add(d.MessageId)
		switch {
		case d.MessageId == "transient" && n == 1:
			return errors.New("smtp timeout")
		case d.MessageId == "invalid":
			return idem.Permanent(errors.New("no customer"))
		}
		return nil
	}, idemamqp.WithRetryDelay(10*time.Millisecond), idemamqp.WithLogger(quiet))

	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			h(context.Background(), d)
			handled.Add(1)
		}
	}()
	waitHandled := func(n int32) {
		t.Helper()
		ctx := ctxT(t)
		for handled.Load() < n {
			select {
			case <-ctx.Done():
				t.Fatalf("%d deliveries handled, want %d", handled.Load(), n)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	for _, id := range []string{"p1", "p2", "transient", "invalid", ""} {
		publish(t, pub, queue, id, "body "+id)
	}
	waitHandled(6)                                    // transient twice
	publish(t, pub, queue, "p1", "body p1")           // duplicate
	publish(t, pub, queue, "invalid", "body invalid") // duplicate of a permanent failure
	publish(t, pub, queue, "p2", "another body")      // same key, another payload
	waitHandled(9)
	_ = ch.Close() // unacked deliveries would go back to the queue
	<-done
	for id, want := range map[string]int{"p1": 1, "p2": 1, "transient": 2, "invalid": 1, "": 0} {
		if got := r.get(id); got != want {
			t.Errorf("message %q handled %d times, want %d", id, got, want)
		}
	}
	q, err := pub.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil || q.Messages != 0 {
		t.Fatalf("queue after the run: %+v, %v; want every delivery acked or rejected", q, err)
	}
}

// flakyStore fails its next Acquire calls, as a store that is down.
type flakyStore struct {
	*memstore.Store
	fails atomic.Int32
}

func (s *flakyStore) Acquire(ctx context.Context, key, token, fp string, lease time.Duration) (idem.Record, bool, error) {
	if s.fails.Add(-1) >= 0 {
		return idem.Record{}, false, errors.New("connection refused")
	}
	return s.Store.Acquire(ctx, key, token, fp, lease)
}

// TestRequeued: a delivery whose store is down, or whose key is in
// progress elsewhere, is requeued after the retry delay, and handled once
// when it comes back (a replay, without running the handler, in the second
// case).
func TestRequeued(t *testing.T) {
	conn, pub, queue := newQueue(t)
	store := &flakyStore{Store: memstore.New()}
	defer store.Close()
	e, err := idem.New(store, idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(context.Background()) }()
	var r runs
	h := idemamqp.Handler(e, "send-receipt", func(_ context.Context, d amqp.Delivery) error {
		r.add(d.MessageId)
		return nil
	}, idemamqp.WithRetryDelay(10*time.Millisecond), idemamqp.WithLogger(quiet))
	w := consumeWatched(t, conn, queue, h)
	wait := w.wait
	acked, redelivered := w.acked, w.redelivered

	store.fails.Store(3)
	publish(t, pub, queue, "down", "body")
	wait(acked, "down")
	if got := r.get("down"); got != 1 || store.fails.Load() >= 0 {
		t.Fatalf("handled %d times (store failures left %d), want once after the store came back", got, store.fails.Load())
	}

	// The key is held by another execution (another instance's handler).
	started, finish := make(chan struct{}), make(chan struct{})
	result := make(chan error, 1)
	go func() {
		_, err := idem.Do(context.Background(), e, idem.Operation{Name: "send-receipt", Key: "busy", Payload: []byte("body")},
			func(context.Context) (struct{}, error) {
				close(started)
				<-finish
				return struct{}{}, nil
			})
		result <- err
	}()
	<-started
	publish(t, pub, queue, "busy", "body")
	wait(redelivered, "busy")
	close(finish)
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	wait(acked, "busy")
	w.stop()
	if got := r.get("busy"); got != 0 {
		t.Fatalf("handler ran %d times for a key another execution completed, want 0", got)
	}
}

// watched is a consumer of a queue that runs a handler on each delivery
// and reports what happened to them.
type watched struct {
	t                  *testing.T
	acked, redelivered chan string // message ids
	mu                 sync.Mutex
	delivered          map[string]int
	ch                 *amqp.Channel
	done               chan struct{}
}

// consumeWatched consumes queue on a channel of its own (autoAck false) and
// runs h on each delivery until stop.
func consumeWatched(t *testing.T, conn *amqp.Connection, queue string, h func(context.Context, amqp.Delivery)) *watched {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &watched{t: t, acked: make(chan string, 100), redelivered: make(chan string, 100), delivered: map[string]int{}, ch: ch, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for d := range deliveries {
			w.mu.Lock()
			w.delivered[d.MessageId]++
			w.mu.Unlock()
			if d.Redelivered {
				w.redelivered <- d.MessageId
			}
			d.Acknowledger = &watch{Acknowledger: d.Acknowledger, id: d.MessageId, acked: w.acked}
			h(context.Background(), d)
		}
	}()
	return w
}

// wait waits until id comes on c.
func (w *watched) wait(c chan string, id string) {
	w.t.Helper()
	for {
		select {
		case got := <-c:
			if got == id {
				return
			}
		case <-ctxT(w.t).Done():
			w.t.Fatalf("%s never seen", id)
		}
	}
}

// deliveries returns how often id was delivered.
func (w *watched) deliveries(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.delivered[id]
}

// stop closes the channel and waits for the handler to return.
func (w *watched) stop() {
	_ = w.ch.Close()
	<-w.done
}

// watch reports the acks of a delivery.
type watch struct {
	amqp.Acknowledger
	id    string
	acked chan string
}

func (w *watch) Ack(tag uint64, multiple bool) error {
	err := w.Acknowledger.Ack(tag, multiple)
	w.acked <- w.id
	return err
}
