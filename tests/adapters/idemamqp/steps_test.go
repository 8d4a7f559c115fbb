package idemamqp_test

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/adapters/idemamqp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/tests/adapters/internal/client"
)

// TestStepTakeover: a RabbitMQ handler calling idem.Step with its ctx
// journals the step. Two consumer instances (channels) get from one queue:
// the first runs the step and stalls past its lease, its delivery unacked;
// the duplicate (same message id) reaches the second, is requeued while
// the key is in progress, then takes the execution over and gets the
// journaled result without the step running again.
func TestStepTakeover(t *testing.T) {
	conn, pub, queue := newQueue(t)
	mem := memstore.New()
	defer mem.Close()
	e, err := idem.New(adaptertest.CrashableJournal(mem), idem.WithLogger(quiet), idem.WithStoreTimeout(250*time.Millisecond), idem.WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(context.Background()) }()
	st := client.NewStepper(t)
	h := idemamqp.Handler(e, "charge", func(ctx context.Context, _ amqp.Delivery) error { return st.Run(ctx) },
		idemamqp.WithRetryDelay(10*time.Millisecond), idemamqp.WithLogger(quiet))
	instance := func() *amqp.Channel {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ch.Close() })
		return ch
	}
	a, b := instance(), instance()
	get := func(ch *amqp.Channel) (amqp.Delivery, bool) {
		t.Helper()
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			time.Sleep(10 * time.Millisecond)
		}
		return d, ok
	}

	publish(t, pub, queue, "order-1", "body")
	var first amqp.Delivery
	for deadline, ok := time.Now().Add(20*time.Second), false; !ok; first, ok = get(a) {
		if time.Now().After(deadline) {
			t.Fatal("the message never reached the first instance")
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); h(context.Background(), first) }() // the stalled instance
	defer wg.Wait()
	defer st.Release()
	st.WaitJournaled(t, 1)
	publish(t, pub, queue, "order-1", "body")
	for deadline := time.Now().Add(20 * time.Second); st.Journaled() < 2; {
		if d, ok := get(b); ok { // the second instance: in progress (requeued), then the takeover
			h(context.Background(), d)
		}
		if time.Now().After(deadline) {
			t.Fatal("the duplicate never took the stalled execution over")
		}
	}
	st.CheckTakeover(t)
	st.Release()
	wg.Wait()
	// The stalled instance's delivery, if it was requeued: acked, not run.
	for empty := 0; empty < 20; empty++ {
		if d, ok := get(b); ok {
			h(context.Background(), d)
			empty = 0
		}
	}
	st.CheckTakeover(t)
}
