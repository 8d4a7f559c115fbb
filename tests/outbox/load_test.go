package outboxtest

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/adapters/idemamqp"
	"github.com/idemkit/idem/adapters/idemnats"
	"github.com/idemkit/idem/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

// lags is an outbox.Observer keeping every relay lag.
type lags struct {
	mu     sync.Mutex
	lag    []time.Duration
	failed int
}

func (l *lags) Published(_ context.Context, _ outbox.Message, lag time.Duration) {
	l.mu.Lock()
	l.lag = append(l.lag, lag)
	l.mu.Unlock()
}

func (l *lags) PublishFailed(context.Context, outbox.Message, error) {
	l.mu.Lock()
	l.failed++
	l.mu.Unlock()
}

func (l *lags) Pending(context.Context, int64, time.Duration) {}

func (l *lags) quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := slices.Clone(l.lag)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// TestLoad relays messages from PostgreSQL and from MariaDB with one
// relay (4 workers, batches of 100, pipelined: one key per message) to
// NATS JetStream (a server of its own) and to RabbitMQ, consumed through
// idem: every message yields one effect. It logs the relay's throughput
// (a backlog of n messages drained) and its lag (enqueue to broker
// confirm) for n more enqueued, in transactions of 10 by one writer
// (whose rate it logs too), while it runs; for RESULTS.md: make soak plays n =
// 10,000 per broker, go test 250.
func TestLoad(t *testing.T) {
	n := 250
	if *soak {
		n = 10000
	}
	type loadCase struct {
		d      outbox.Dialect
		broker string
	}
	var cases []loadCase
	for _, d := range dialects {
		for _, broker := range []string{"nats", "amqp"} {
			cases = append(cases, loadCase{d, broker})
		}
	}
	for _, c := range cases {
		d, broker := c.d, c.broker
		t.Run(d.String()+"/"+broker, func(t *testing.T) {
			db, _ := openDB(t, d)
			_, pool := openDB(t, outbox.PostgreSQL) // the consumer's store
			ob := newOutbox(t, db, d)
			var (
				pub     outbox.Publisher
				subject string
				fx      *effects
			)
			switch broker {
			case "nats":
				nodes := startNATS(t, 1)
				_, js := connect(t, urls(nodes))
				name := strings.ToUpper(uniq("load"))
				subject = name + ".payment.created"
				s := createStream(t, js, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage})
				fx = newEffects(t, pool)
				consumeNATS(t, s, fx.natsHandler())
				pub = idemnats.NewPublisher(js)
			case "amqp":
				w := newAMQPWorld(t)
				fx, subject = w.fx, w.queue
				p := idemamqp.NewPublisher(func() (*amqp.Connection, error) { return amqp.Dial(amqpURL()) }, "")
				t.Cleanup(func() { _ = p.Close() })
				pub = p
			}
			ids := paymentIDs(2 * n)
			enqueue := func(ids []string) {
				for i := 0; i < len(ids); i += 10 {
					tx, err := db.BeginTx(context.Background(), nil)
					if err != nil {
						t.Fatal(err)
					}
					var msgs []outbox.Message
					for j := i; j < min(len(ids), i+10); j++ {
						msgs = append(msgs, outbox.Message{ID: ids[j], Key: ids[j], Subject: subject, Payload: []byte(ids[j])}) // one aggregate per payment
					}
					if err := ob.Enqueue(context.Background(), tx, msgs...); err != nil {
						t.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
				}
			}
			run := func(obs outbox.Observer) func() {
				r, err := outbox.NewRelay(db, ob, pub, outbox.WithWorkers(4), outbox.WithBatchSize(100), outbox.WithObserver(obs),
					outbox.WithPollInterval(10*time.Millisecond), outbox.WithLogger(quiet))
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- r.Run(ctx) }()
				return func() {
					cancel()
					if err := <-done; err != nil {
						t.Error(err)
					}
				}
			}
			empty := func() {
				waitFor(t, "an empty outbox", 10*time.Minute, func() bool { return unsent(t, db, ob.Table()) == 0 })
			}

			// A backlog of n messages drained: the relay's throughput.
			enqueue(ids[:n])
			start := time.Now()
			stop := run(&lags{})
			empty()
			drained := time.Since(start)
			stop()
			// n messages enqueued while the relay runs: its lag.
			obs := &lags{}
			stop = run(obs)
			start = time.Now()
			enqueue(ids[n:])
			wrote := time.Since(start)
			empty()
			stop()
			waitFor(t, "an effect per message", 10*time.Minute, func() bool { return len(fx.counts()) == 2*n })
			fx.checkExactlyOnce(ids)
			t.Logf("%s/%s: a backlog of %d messages relayed in %v: %.0f msg/s; %d more enqueued while relaying (transactions of 10, one writer, %.0f msg/s): lag p50 %v, p99 %v, max %v; %d publish errors",
				d, broker, n, drained.Round(time.Millisecond), float64(n)/drained.Seconds(), n, float64(n)/wrote.Seconds(),
				obs.quantile(0.5).Round(time.Millisecond), obs.quantile(0.99).Round(time.Millisecond), obs.quantile(1).Round(time.Millisecond), obs.failed)
		})
	}
}
