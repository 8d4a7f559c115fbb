package idemnats_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/adapters/idemnats"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/tests/adapters/internal/client"
)

// TestOutcomes drives the consumer into operation-uncertain (a holder
// whose lease lapsed under WithUncertainAfterCrash), key-expired (a short
// retention with tombstones) and key-reused through a real JetStream
// stream: the uncertain message is terminated once (never redelivered,
// JetStream's MSG_TERMINATED advisory published) with a warning naming the
// record key idemctl takes; the expired one is acked without running the
// handler, with an info line; the reused one is terminated.
func TestOutcomes(t *testing.T) {
	js, s, name := newStream(t)
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
	nc, err := nats.Connect(natsURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	terminated, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + name + ".receipts")
	if err != nil {
		t.Fatal(err)
	}
	var r runs
	c := consume(t, s, idemnats.Handler(e, "send-receipt", func(_ context.Context, msg jetstream.Msg) error {
		r.add(msg.Headers().Get(jetstream.MsgIDHeader))
		return nil
	}, idemnats.WithRetryDelay(10*time.Millisecond), idemnats.WithLogger(logger)))

	// Uncertain: another instance's execution of the key stalls past its
	// lease (as a crashed one would).
	op := idem.Operation{Scope: name, Name: "send-receipt", Key: "crashed", Payload: []byte("body")}
	release := client.Hold(t, e, op)
	client.WaitForDo(t, e, op, idem.ErrUncertain)
	publish(t, js, name+".pay", "crashed", "body")
	settled(t, c)
	if _, err := terminated.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("no MSG_TERMINATED advisory for the uncertain message: %v", err)
	}
	info, err := c.Info(ctxT(t))
	if err != nil || info.Delivered.Consumer != 1 || info.NumRedelivered != 0 {
		t.Fatalf("consumer %+v, %v: want the uncertain message delivered once, never redelivered", info, err)
	}
	if !strings.Contains(logs.String(), "parked for an operator") || !strings.Contains(logs.String(), "key="+op.RecordKey()) {
		t.Fatalf("log %q: want a warning naming the record key %s", logs.String(), op.RecordKey())
	}
	release()

	// Key-expired: processed once, its record's retention over.
	publish(t, js, name+".pay", "spent", "body")
	settled(t, c)
	client.WaitForDo(t, e, idem.Operation{Scope: name, Name: "send-receipt", Key: "spent", Payload: []byte("body")}, idem.ErrKeyExpired)
	time.Sleep(200 * time.Millisecond) // past the stream's duplicate window
	publish(t, js, name+".pay", "spent", "body")
	settled(t, c)
	if !strings.Contains(logs.String(), "already processed once") {
		t.Fatalf("log %q: want the expired message's info line", logs.String())
	}

	// Key-reused: the same key with another payload.
	publish(t, js, name+".pay", "reused", "body")
	settled(t, c)
	time.Sleep(200 * time.Millisecond)
	publish(t, js, name+".pay", "reused", "another body")
	settled(t, c)
	if _, err := terminated.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("no MSG_TERMINATED advisory for the reused key: %v", err)
	}
	info, err = c.Info(ctxT(t))
	if err != nil || info.Delivered.Consumer != 5 || info.NumRedelivered != 0 {
		t.Fatalf("consumer %+v, %v: want 5 messages each delivered once", info, err)
	}
	for id, want := range map[string]int{"crashed": 0, "spent": 1, "reused": 1} {
		if got := r.get(id); got != want {
			t.Errorf("message %q handled %d times, want %d", id, got, want)
		}
	}
}
