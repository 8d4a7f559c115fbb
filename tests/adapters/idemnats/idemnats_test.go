package idemnats_test

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/idemnats"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

func natsURL() string {
	if u := os.Getenv("IDEM_NATS_URL"); u != "" {
		return u
	}
	return nats.DefaultURL
}

// newStream connects to the NATS server (failing when it does not answer)
// and creates a stream of its own, deleted at the end of the test, whose
// duplicate window is short, so that a message published twice reaches the
// consumer twice (as it does after the default two minutes).
func newStream(t *testing.T) (jetstream.JetStream, jetstream.Stream, string) {
	t.Helper()
	nc, err := nats.Connect(natsURL())
	if err != nil {
		t.Fatalf("NATS at %s: %v (scripts/services.sh starts one)", natsURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := "IDEMTEST_" + strings.ToUpper(rand.Text()[:10])
	ctx := ctxT(t)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Duplicates: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return js, s, name
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func publish(t *testing.T, js jetstream.JetStream, subject, id, body string) {
	t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = []byte(body)
	if id != "" {
		msg.Header.Set(jetstream.MsgIDHeader, id)
	}
	if _, err := js.PublishMsg(ctxT(t), msg); err != nil {
		t.Fatal(err)
	}
}

// consume runs h on a durable consumer of s until the test ends.
func consume(t *testing.T, s jetstream.Stream, h jetstream.MessageHandler) jetstream.Consumer {
	t.Helper()
	c, err := s.CreateOrUpdateConsumer(ctxT(t), jetstream.ConsumerConfig{Durable: "receipts", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.Consume(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return c
}

// settled waits until every message of the consumer is acked or terminated.
func settled(t *testing.T, c jetstream.Consumer) {
	t.Helper()
	ctx := ctxT(t)
	for {
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("messages never settled: %+v", info)
		case <-time.After(20 * time.Millisecond):
		}
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

func newEngine(t *testing.T) *idem.Engine {
	t.Helper()
	s := memstore.New()
	e, err := idem.New(s, idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()); s.Close() })
	return e
}

func TestHandler(t *testing.T) {
	js, s, name := newStream(t)
	var r runs
	h := idemnats.Handler(newEngine(t), "send-receipt", func(ctx context.Context, msg jetstream.Msg) error {
		if _, ok := idem.InfoFromContext(ctx); !ok {
			t.Error("handler context without the execution")
		}
		id := msg.Headers().Get(jetstream.MsgIDHeader)
		n := r.add(id)
		switch {
		case id == "transient" && n == 1:
			return errors.New("smtp timeout")
		case id == "invalid":
			return idem.Permanent(errors.New("no customer"))
		}
		return nil
	}, idemnats.WithRetryDelay(10*time.Millisecond), idemnats.WithLogger(quiet))
	c := consume(t, s, h)
	for _, id := range []string{"p1", "p2", "transient", "invalid", ""} {
		publish(t, js, name+".pay", id, "body "+id)
	}
	settled(t, c)
	time.Sleep(200 * time.Millisecond)                     // past the stream's duplicate window: the copies are stored
	publish(t, js, name+".pay", "p1", "body p1")           // duplicate
	publish(t, js, name+".pay", "invalid", "body invalid") // duplicate of a permanent failure
	publish(t, js, name+".pay", "p2", "another body")      // same key, another payload
	settled(t, c)
	for id, want := range map[string]int{"p1": 1, "p2": 1, "transient": 2, "invalid": 1, "": 0} {
		if got := r.get(id); got != want {
			t.Errorf("message %q handled %d times, want %d", id, got, want)
		}
	}
	info, err := s.Info(ctxT(t))
	if err != nil || info.State.Msgs != 8 {
		t.Fatalf("stream holds %+v, %v; want 8 messages (the copies were not deduplicated by JetStream)", info.State, err)
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

// TestRedelivered: a message whose store is down, or whose key is in
// progress elsewhere, is naked with a delay, and handled once when it
// comes back (a replay, without running the handler, in the second case).
func TestRedelivered(t *testing.T) {
	js, s, name := newStream(t)
	store := &flakyStore{Store: memstore.New()}
	defer store.Close()
	e, err := idem.New(store, idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(context.Background()) }()
	var r runs
	c := consume(t, s, idemnats.Handler(e, "send-receipt", func(_ context.Context, msg jetstream.Msg) error {
		r.add(msg.Headers().Get(jetstream.MsgIDHeader))
		return nil
	}, idemnats.WithRetryDelay(10*time.Millisecond), idemnats.WithLogger(quiet)))

	store.fails.Store(3)
	publish(t, js, name+".pay", "down", "body")
	settled(t, c)
	if got := r.get("down"); got != 1 || store.fails.Load() >= 0 {
		t.Fatalf("handled %d times (store failures left %d), want once after the store came back", got, store.fails.Load())
	}

	// The key is held by another execution (another instance's handler).
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idem.Do(context.Background(), e, idem.Operation{Scope: name, Name: "send-receipt", Key: "busy", Payload: []byte("body")},
			func(context.Context) (struct{}, error) {
				close(started)
				<-finish
				return struct{}{}, nil
			})
		done <- err
	}()
	<-started
	publish(t, js, name+".pay", "busy", "body")
	waitNaked(t, c)
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	settled(t, c)
	if got := r.get("busy"); got != 0 {
		t.Fatalf("handler ran %d times for a key another execution completed, want 0", got)
	}
}

// waitNaked waits until the consumer has redelivered a message.
func waitNaked(t *testing.T, c jetstream.Consumer) {
	t.Helper()
	ctx := ctxT(t)
	for {
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumRedelivered > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("never redelivered: %+v", info)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
