package outboxtest

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/adapters/idemamqp"
	"github.com/idemkit/idem/outbox"
)

// TestAMQPPublisherChannelClosed publishes to an exchange that does not
// exist: the broker closes the channel (404 NOT_FOUND) while the confirm
// is pending. Every call returns that error (hang guard: 60s over its
// 10s deadline) and the next one opens a new channel, over and over, and
// a message for an existing queue is confirmed after them.
func TestAMQPPublisherChannelClosed(t *testing.T) {
	w := newAMQPWorld(t)
	missing := uniq("missing")
	pub := idemamqp.NewPublisher(func() (*amqp.Connection, error) { return amqp.Dial(amqpURL()) }, missing)
	t.Cleanup(func() { _ = pub.Close() })
	publish := func(p *idemamqp.Publisher, m outbox.Message) error {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done <- p.Publish(ctx, m)
		}()
		select {
		case err := <-done:
			return err
		case <-time.After(70 * time.Second):
			t.Fatal("Publish with a 10s deadline has not returned after 70s")
			return nil
		}
	}
	ids := paymentIDs(4)
	for _, id := range ids[:3] {
		err := publish(pub, outbox.Message{ID: id, Subject: w.queue, Payload: []byte(id)})
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
			t.Fatalf("Publish to a missing exchange: %v; want the broker's 404 channel close", err)
		}
	}
	good := idemamqp.NewPublisher(func() (*amqp.Connection, error) { return amqp.Dial(amqpURL()) }, "")
	t.Cleanup(func() { _ = good.Close() })
	if err := publish(good, outbox.Message{ID: ids[3], Subject: w.queue, Payload: []byte(ids[3])}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the message delivered", 60*time.Second, func() bool { return len(w.fx.counts()) == 1 })
	w.fx.checkExactlyOnce(ids[3:])
}
