package idemamqp_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/adapters/idemamqp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/tests/adapters/internal/client"
)

// newQueueDLX declares a queue of its own whose rejected deliveries are
// dead-lettered to a second queue, both deleted at the end of the test.
func newQueueDLX(t *testing.T) (conn *amqp.Connection, ch *amqp.Channel, queue, dead string) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		t.Fatalf("RabbitMQ at %s: %v (scripts/services.sh starts one)", amqpURL(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	suffix := rand.Text()[:10]
	queue, dead = "idemtest-outcomes-"+suffix, "idemtest-outcomes-dead-"+suffix
	if _, err := ch.QueueDeclare(dead, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_, _ = ch.QueueDelete(dead, false, false, false)
			_ = ch.Close()
		}
	})
	return conn, ch, queue, dead
}

// TestOutcomes drives the consumer into operation-uncertain (a holder
// whose lease lapsed under WithUncertainAfterCrash), key-expired (a short
// retention with tombstones) and key-reused through a real RabbitMQ queue
// with a dead-letter exchange: the uncertain delivery is rejected once to
// the dead-letter queue (never requeued) with a warning naming the record
// key idemctl takes; the expired one is acked without running the handler,
// with an info line; the reused one is dead-lettered.
func TestOutcomes(t *testing.T) {
	conn, pub, queue, dead := newQueueDLX(t)
	mem := memstore.New()
	defer mem.Close()
	var logs client.Log
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	e, err := idem.New(adaptertest.Crashable(mem), idem.WithLogger(quiet), idem.WithStoreTimeout(250*time.Millisecond),
		idem.WithLease(time.Second), idem.WithUncertainAfterCrash(time.Hour), idem.WithRetention(300*time.Millisecond), idem.WithTombstones(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(context.Background()) }()
	var r runs
	h := idemamqp.Handler(e, "send-receipt", func(_ context.Context, d amqp.Delivery) error {
		r.add(d.MessageId)
		return nil
	}, idemamqp.WithRetryDelay(10*time.Millisecond), idemamqp.WithLogger(logger))
	w := consumeWatched(t, conn, queue, h)
	deadCh, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deadLetters, err := deadCh.Consume(dead, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitDead := func(id string) {
		t.Helper()
		select {
		case d := <-deadLetters:
			if d.MessageId != id {
				t.Fatalf("dead-lettered %q, want %q", d.MessageId, id)
			}
		case <-ctxT(t).Done():
			t.Fatalf("%s never dead-lettered", id)
		}
	}
	waitAcked := func(id string) { t.Helper(); w.wait(w.acked, id) }

	// Uncertain: another instance's execution of the key stalls past its
	// lease (as a crashed one would).
	op := idem.Operation{Name: "send-receipt", Key: "crashed", Payload: []byte("body")}
	release := client.Hold(t, e, op)
	client.WaitForDo(t, e, op, idem.ErrUncertain)
	publish(t, pub, queue, "crashed", "body")
	waitDead("crashed")
	if !strings.Contains(logs.String(), "parked for an operator") || !strings.Contains(logs.String(), "key="+op.RecordKey()) {
		t.Fatalf("log %q: want a warning naming the record key %s", logs.String(), op.RecordKey())
	}
	release()

	// Key-expired: processed once, its record's retention over.
	publish(t, pub, queue, "spent", "body")
	waitAcked("spent")
	client.WaitForDo(t, e, idem.Operation{Name: "send-receipt", Key: "spent", Payload: []byte("body")}, idem.ErrKeyExpired)
	publish(t, pub, queue, "spent", "body")
	waitAcked("spent")
	if !strings.Contains(logs.String(), "already processed once") {
		t.Fatalf("log %q: want the expired delivery's info line", logs.String())
	}

	// Key-reused: the same key with another payload.
	publish(t, pub, queue, "reused", "body")
	waitAcked("reused")
	publish(t, pub, queue, "reused", "another body")
	waitDead("reused")

	w.stop()
	for id, want := range map[string]int{"crashed": 1, "spent": 2, "reused": 2} {
		if got := w.deliveries(id); got != want {
			t.Errorf("%q delivered %d times, want %d (no requeue)", id, got, want)
		}
	}
	for id, want := range map[string]int{"crashed": 0, "spent": 1, "reused": 1} {
		if got := r.get(id); got != want {
			t.Errorf("%q handled %d times, want %d", id, got, want)
		}
	}
}
