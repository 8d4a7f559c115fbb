package idemnats_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/adapters/idemnats"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/tests/adapters/internal/client"
)

// TestStepTakeover: a JetStream handler calling idem.Step with its ctx
// journals the step. Two consumer instances fetch from one durable
// consumer: the first runs the step and stalls past its lease; the
// duplicate message (same Nats-Msg-Id) reaches the second, is redelivered
// while the key is in progress, then takes the execution over and gets the
// journaled result without the step running again. Everything settles.
func TestStepTakeover(t *testing.T) {
	js, s, name := newStream(t)
	mem := memstore.New()
	defer mem.Close()
	e, err := idem.New(adaptertest.CrashableJournal(mem), idem.WithLogger(quiet), idem.WithStoreTimeout(250*time.Millisecond), idem.WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(context.Background()) }()
	c, err := s.CreateOrUpdateConsumer(ctxT(t), jetstream.ConsumerConfig{Durable: "steps", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st := client.NewStepper(t)
	h := idemnats.Handler(e, "charge", func(ctx context.Context, _ jetstream.Msg) error { return st.Run(ctx) },
		idemnats.WithRetryDelay(10*time.Millisecond), idemnats.WithLogger(quiet))
	fetch := func() []jetstream.Msg {
		t.Helper()
		b, err := c.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		var msgs []jetstream.Msg
		for m := range b.Messages() {
			msgs = append(msgs, m)
		}
		return msgs
	}

	publish(t, js, name+".pay", "order-1", "body")
	var first []jetstream.Msg
	for deadline := time.Now().Add(20 * time.Second); len(first) == 0; first = fetch() {
		if time.Now().After(deadline) {
			t.Fatal("the message never reached the first instance")
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); h(first[0]) }() // the stalled instance
	defer wg.Wait()
	defer st.Release()
	st.WaitJournaled(t, 1)
	time.Sleep(200 * time.Millisecond) // past the stream's duplicate window
	publish(t, js, name+".pay", "order-1", "body")
	for deadline := time.Now().Add(20 * time.Second); st.Journaled() < 2; {
		for _, m := range fetch() { // the second instance: in progress (redelivered), then the takeover
			h(m)
		}
		if time.Now().After(deadline) {
			t.Fatal("the duplicate never took the stalled execution over")
		}
	}
	st.CheckTakeover(t)
	st.Release()
	wg.Wait()
	for deadline := time.Now().Add(20 * time.Second); ; { // the stalled instance's message, if redelivered: acked, not run
		info, err := c.Info(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("messages never settled: %+v", info)
		}
		for _, m := range fetch() {
			h(m)
		}
	}
	st.CheckTakeover(t)
}
