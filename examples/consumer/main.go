// Command consumer is a payments-event consumer that sends one receipt
// email per payment, however often the broker delivers the event: each
// payment.created message writes one row to a PostgreSQL outbox table
// (the email sender's queue) through the execution's transaction
// (pgstore.Tx), so the row commits together with idem's record, exactly
// once even when the consumer is killed between the write and the ack.
// Run it against the local brokers with one command:
//
//	go run ./examples/consumer -broker nats -publish 5   # or -broker amqp, -broker kafka
//
// No Kafka broker is needed for -broker kafka: without -kafka (seed
// brokers) the command starts kfake, franz-go's Kafka written in Go,
// inside its own process (topic <name>, 4 partitions, and <name>.DLT), gone
// when it exits. To kill consumers alone, run kfake as a process of its own
// and point the consumers at it:
//
//	go run ./examples/consumer -serve-kfake 9092 &
//	go run ./examples/consumer -broker kafka -kafka 127.0.0.1:9092 -publish 5
//
// It plays the payments service first: 5 payments, each committed with its
// payment.created event in one transaction (outbox.Enqueue into the table
// <name>_events), published by an outbox relay (message id
// "payment.created:<payment id>": Nats-Msg-Id, AMQP message-id); then it
// handles them, prints the receipts, and exits once idle. Without -publish it
// consumes until SIGINT or SIGTERM. The other flags inject the failures
// examples/consumer's tests play (slow handlers to be killed in, lost acks)
// and run it without idem (-idem=false) for comparison.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel"

	"github.com/idemkit/idem/adapters/idemamqp"
	"github.com/idemkit/idem/adapters/idemkafka"
	"github.com/idemkit/idem/adapters/idemnats"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemotel"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/stores/pgstore"
)

// Payment is the payment.created event.
type Payment struct {
	ID     string `json:"id"`
	Email  string `json:"email"`
	Amount int    `json:"amount"`
}

type options struct {
	broker, natsURL, amqpURL, kafka, pgURL, name string
	useIdem                                      bool
	publish                                      int
	exitIdle, slow, ackDelay, ackWait            time.Duration
	session                                      time.Duration
	kafkaLog                                     bool
	lease, storeTimeout, retryDelay              time.Duration
	loseAcks, prefetch                           int
	serveKfake                                   int // -serve-kfake: the port of a kfake cluster to run alone
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	var o options
	flag.StringVar(&o.broker, "broker", "nats", "nats (JetStream), amqp (RabbitMQ) or kafka")
	flag.StringVar(&o.natsURL, "nats", env("IDEM_NATS_URL", nats.DefaultURL), "NATS server URL")
	flag.StringVar(&o.amqpURL, "amqp", env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.StringVar(&o.kafka, "kafka", os.Getenv("IDEM_KAFKA_BROKERS"), "Kafka seed brokers, comma-separated (empty: a kfake cluster started in this process, gone when it exits; -serve-kfake runs one in a process of its own)")
	flag.IntVar(&o.serveKfake, "serve-kfake", 0, "run only a kfake cluster on 127.0.0.1:PORT (topics <name>, 4 partitions, and <name>.DLT) until SIGINT or SIGTERM, so that consumers started with -kafka 127.0.0.1:PORT can be killed alone")
	flag.DurationVar(&o.session, "kafka-session", 45*time.Second, "Kafka group session and rebalance timeout: how long a killed consumer keeps its partitions, and a rebalance waits for members to rejoin")
	flag.BoolVar(&o.kafkaLog, "kafka-log", false, "Kafka: log kgo's info lines (group sessions, assignments, revokes) to stderr, prefixed with the process id")
	flag.StringVar(&o.pgURL, "postgres", env("IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test"), "PostgreSQL URL")
	flag.StringVar(&o.name, "name", "payments", "stream (upper-cased) or queue name; also the prefix of the tables it creates: <name>_idem (idem's records) and <name>_outbox (the receipts), and with -publish <name>_payments, <name>_events and <name>_events_partitions (the payments and their outbox)")
	flag.BoolVar(&o.useIdem, "idem", true, "handle messages through idem (false: plain at-least-once handling, for comparison)")
	flag.IntVar(&o.publish, "publish", 0, "commit this many payments with their payment.created events in an outbox (table <name>_events) and relay them while consuming; then exit once idle")
	flag.DurationVar(&o.exitIdle, "exit-idle", 0, "exit after this long without a message (default 2s with -publish, else never)")
	flag.DurationVar(&o.slow, "slow", 0, "handler time after its outbox write (a window to be killed in); Kafka: also print each attempt at a record and each handler's start and end, with partition and time")
	flag.DurationVar(&o.ackDelay, "ack-delay", 0, "pause before each ack, Kafka: before each offset commit request (a window to be killed in after the commit)")
	flag.IntVar(&o.loseAcks, "lose-acks", 0, "lose the ack of every n-th message handled (NATS: not sent, redelivered after -ack-wait; AMQP: channel closed without it, requeued)")
	flag.IntVar(&o.prefetch, "prefetch", 8, "messages buffered per consumer (NATS PullMaxMessages, AMQP Qos); keep prefetch × handler time below the ack wait, or buffered messages are redelivered elsewhere")
	flag.DurationVar(&o.ackWait, "ack-wait", 30*time.Second, "NATS consumer AckWait")
	flag.DurationVar(&o.lease, "lease", idem.DefaultLease, "idem lease")
	flag.DurationVar(&o.storeTimeout, "store-timeout", idem.DefaultStoreTimeout, "idem store timeout")
	flag.DurationVar(&o.retryDelay, "retry-delay", time.Second, "redelivery delay when a message is in progress elsewhere or the store is down")
	flag.Parse()
	if o.publish > 0 && o.exitIdle == 0 {
		o.exitIdle = 2 * time.Second
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.serveKfake > 0 {
		err := serveKfake(ctx, o.serveKfake, o.name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "consumer:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// consumer is what both brokers share: the database, the engine and the
// handler's effect.
type consumer struct {
	o      options
	pool   *pgxpool.Pool
	engine *idem.Engine
	outbox string
	ran    []string     // ids of the payments this run made (-publish)
	last   atomic.Int64 // unix nanos of the last message handled
	seen   atomic.Int64 // messages handled, for -lose-acks
}

func run(ctx context.Context, o options) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pool, err := pgxpool.New(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := pgstore.New(pool, pgstore.WithTable(o.name+"_idem"), pgstore.WithLogger(logger))
	defer func() { _ = store.Close() }()
	c := &consumer{o: o, pool: pool, outbox: pgx.Identifier{o.name + "_outbox"}.Sanitize()}
	if err := store.EnsureSchema(ctx); err != nil {
		return err
	}
	if err := store.StartPurger(time.Hour); err != nil { // deletes expired records; store.Close stops it
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+c.outbox+` (
		id bigserial PRIMARY KEY, payment_id text NOT NULL, email text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	c.engine, err = idem.New(store, idem.WithLease(o.lease), idem.WithStoreTimeout(o.storeTimeout), idem.WithLogger(logger))
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.engine.Close(ctx)
	}()
	c.last.Store(time.Now().UnixNano())
	if o.exitIdle > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go c.exitWhenIdle(ctx, cancel)
	}
	switch o.broker {
	case "nats":
		err = c.runNATS(ctx, logger)
	case "amqp":
		err = c.runAMQP(ctx, logger)
	case "kafka":
		err = c.runKafka(ctx, logger)
	default:
		return fmt.Errorf("-broker %q: want nats, amqp or kafka", o.broker)
	}
	if err != nil || o.publish == 0 {
		return err
	}
	return c.printOutbox()
}

// sendReceipt is the handler's effect: one outbox row for the payment's
// receipt email. Through idem it is written in the execution's
// transaction; without idem it commits at once.
func (c *consumer) sendReceipt(ctx context.Context, body []byte) error {
	ctx, span := otel.Tracer("examples/consumer").Start(ctx, "payment.created process")
	defer span.End()
	var p Payment
	if err := json.Unmarshal(body, &p); err != nil || p.ID == "" {
		return idem.Permanent(fmt.Errorf("unreadable payment event %q", body)) // never retried
	}
	var db interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	} = c.pool
	if c.o.useIdem {
		tx, err := pgstore.Tx(ctx)
		if err != nil {
			return err
		}
		db = tx
	}
	if _, err := db.Exec(ctx, `INSERT INTO `+c.outbox+` (payment_id, email) VALUES ($1, $2)`, p.ID, p.Email); err != nil {
		return err
	}
	if c.o.slow > 0 {
		fmt.Println("wrote", p.ID) // the tests kill the process now, mid-handler
		time.Sleep(c.o.slow)
	}
	return nil
}

// loseAck reports whether the ack of the message being handled is to be
// lost (-lose-acks).
func (c *consumer) loseAck() bool {
	n := c.seen.Add(1)
	c.last.Store(time.Now().UnixNano())
	return c.o.loseAcks > 0 && n%int64(c.o.loseAcks) == 0
}

// pauseBeforeAck waits -ack-delay before an ack: the record is completed,
// the broker does not know yet.
func (c *consumer) pauseBeforeAck() {
	if c.o.ackDelay > 0 {
		fmt.Println("acking") // the tests kill the process now, between commit and ack
		time.Sleep(c.o.ackDelay)
	}
}

func (c *consumer) exitWhenIdle(ctx context.Context, cancel context.CancelFunc) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if time.Since(time.Unix(0, c.last.Load())) > c.o.exitIdle {
				cancel()
				return
			}
		}
	}
}

// printOutbox prints the receipts of the payments this run made; the
// table may hold earlier runs' too.
func (c *consumer) printOutbox() error {
	rows, err := c.pool.Query(context.Background(), `SELECT payment_id, email FROM `+c.outbox+` WHERE payment_id = ANY($1) ORDER BY id`, c.ran)
	if err != nil {
		return err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id, email string
		if err := rows.Scan(&id, &email); err != nil {
			return err
		}
		n++
		fmt.Printf("receipt for %s to %s\n", id, email)
	}
	fmt.Printf("%d receipts for this run's %d payments in %s\n", n, len(c.ran), c.outbox)
	return rows.Err()
}

// payments plays the payments service (-publish): each payment row commits
// with its payment.created event in one transaction, and a relay publishes
// the committed events to subject (the NATS subject, or the AMQP routing
// key) until ctx is done.
func (c *consumer) payments(ctx context.Context, subject string, pub outbox.Publisher) error {
	if c.o.publish == 0 {
		return nil
	}
	db := stdlib.OpenDBFromPool(c.pool)
	ob, err := outbox.New(outbox.PostgreSQL, outbox.WithTable(c.o.name+"_events"), outbox.WithHeaders(idemotel.InjectTraceContext))
	if err != nil {
		return err
	}
	if err := ob.EnsureSchema(ctx, db); err != nil {
		return err
	}
	payments := pgx.Identifier{c.o.name + "_payments"}.Sanitize()
	if _, err := c.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+payments+` (id text PRIMARY KEY, email text NOT NULL, amount integer NOT NULL)`); err != nil {
		return err
	}
	for _, p := range samplePayments(c.o.publish) {
		b, _ := json.Marshal(p)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+payments+` (id, email, amount) VALUES ($1, $2, $3)`, p.ID, p.Email, p.Amount); err != nil {
			_ = tx.Rollback()
			return err
		}
		err = ob.Enqueue(ctx, tx, outbox.Message{ID: "payment.created:" + p.ID, Key: p.Email, Subject: subject, Payload: b})
		if err == nil {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
		}
		if err != nil {
			return err
		}
		c.ran = append(c.ran, p.ID)
	}
	relay, err := outbox.NewRelay(db, ob, pub, outbox.WithPollInterval(50*time.Millisecond))
	if err != nil {
		return err
	}
	go func() { _ = relay.Run(ctx) }()
	for { // until the relay published them all: then the idle clock starts
		n, _, err := relay.Pending(ctx)
		if err != nil {
			return err
		}
		if n == 0 {
			c.last.Store(time.Now().UnixNano())
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func samplePayments(n int) []Payment {
	ps := make([]Payment, n)
	stamp := time.Now().UnixNano()
	for i := range ps {
		ps[i] = Payment{ID: fmt.Sprintf("pay_%d_%d", stamp, i+1), Email: fmt.Sprintf("customer%d@example.com", i+1), Amount: 100 * (i + 1)}
	}
	return ps
}

// --- NATS JetStream ---

func (c *consumer) runNATS(ctx context.Context, logger *slog.Logger) error {
	nc, err := nats.Connect(c.o.natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	name := strings.ToUpper(c.o.name)
	stream, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		stream, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	}
	if err != nil {
		return err
	}
	if err := c.payments(ctx, name+".payment.created", idemnats.NewPublisher(js)); err != nil {
		return err
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "receipts", AckPolicy: jetstream.AckExplicitPolicy, AckWait: c.o.ackWait, MaxAckPending: 16,
	})
	if err != nil {
		return err
	}
	handle := func(ctx context.Context, msg jetstream.Msg) error {
		ctx = idemotel.ExtractTraceContext(ctx, msg.Headers().Get) // the payment handler's trace continues here
		return c.sendReceipt(ctx, msg.Data())
	}
	var h jetstream.MessageHandler
	if c.o.useIdem {
		h = idemnats.Handler(c.engine, "send-receipt", handle, idemnats.WithRetryDelay(c.o.retryDelay), idemnats.WithLogger(logger))
	} else {
		h = func(msg jetstream.Msg) {
			if err := handle(ctx, msg); err != nil {
				_ = msg.NakWithDelay(c.o.retryDelay)
				return
			}
			_ = msg.Ack()
		}
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		h(natsMsg{Msg: msg, c: c, lose: c.loseAck()})
	}, jetstream.PullMaxMessages(c.o.prefetch))
	if err != nil {
		return err
	}
	fmt.Println("ready")
	<-ctx.Done()
	cc.Drain()
	<-cc.Closed()
	return nil
}

// natsMsg delays its ack by -ack-delay, or loses it (-lose-acks).
type natsMsg struct {
	jetstream.Msg
	c    *consumer
	lose bool
}

func (m natsMsg) Ack() error {
	m.c.pauseBeforeAck()
	if m.lose {
		return nil
	}
	return m.Msg.Ack()
}

// --- RabbitMQ ---

func (c *consumer) runAMQP(ctx context.Context, logger *slog.Logger) error {
	conn, err := amqp.Dial(c.o.amqpURL)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	pub, err := conn.Channel()
	if err != nil {
		return err
	}
	if _, err := pub.QueueDeclare(c.o.name, true, false, false, false, nil); err != nil {
		return err
	}
	publisher := idemamqp.NewPublisher(func() (*amqp.Connection, error) { return amqp.Dial(c.o.amqpURL) }, "")
	defer func() { _ = publisher.Close() }()
	if err := c.payments(ctx, c.o.name, publisher); err != nil { // the default exchange routes to the queue by name
		return err
	}
	handle := func(ctx context.Context, d amqp.Delivery) error {
		ctx = idemotel.ExtractTraceContext(ctx, func(k string) string { v, _ := d.Headers[k].(string); return v })
		return c.sendReceipt(ctx, d.Body)
	}
	var h func(context.Context, amqp.Delivery)
	if c.o.useIdem {
		h = idemamqp.Handler(c.engine, "send-receipt", handle, idemamqp.WithRetryDelay(c.o.retryDelay), idemamqp.WithLogger(logger))
	} else {
		h = func(ctx context.Context, d amqp.Delivery) {
			if err := handle(ctx, d); err != nil {
				_ = d.Nack(false, true)
				return
			}
			_ = d.Ack(false)
		}
	}
	fmt.Println("ready")
	for ctx.Err() == nil {
		// One channel at a time; a lost ack closes it, which requeues the
		// delivery whose ack was lost (RabbitMQ's consumer_timeout, the
		// server's own redelivery of unacked deliveries, defaults to 30
		// minutes and is server configuration).
		if err := c.consumeAMQP(ctx, conn, h); err != nil {
			return err
		}
	}
	return nil
}

// consumeAMQP handles deliveries on a new channel until ctx is done or an
// ack is lost.
func (c *consumer) consumeAMQP(ctx context.Context, conn *amqp.Connection, h func(context.Context, amqp.Delivery)) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Qos(c.o.prefetch, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(c.o.name, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("channel closed by the server")
			}
			lost := c.loseAck()
			d.Acknowledger = &amqpAcker{Acknowledger: d.Acknowledger, c: c, lose: lost}
			h(ctx, d)
			if lost {
				return nil // close the channel: the delivery goes back to the queue
			}
		}
	}
}

// amqpAcker delays acks by -ack-delay, or loses them (-lose-acks).
type amqpAcker struct {
	amqp.Acknowledger
	c    *consumer
	lose bool
}

func (a *amqpAcker) Ack(tag uint64, multiple bool) error {
	a.c.pauseBeforeAck()
	if a.lose {
		return nil
	}
	return a.Acknowledger.Ack(tag, multiple)
}

// --- Kafka ---

// serveKfake runs a one-broker kfake cluster on 127.0.0.1:port with the
// topic name (4 partitions) and its dead-letter topic until ctx ends.
func serveKfake(ctx context.Context, port int, name string) error {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.SeedTopics(4, name, name+idemkafka.DefaultDeadLetterSuffix))
	if err != nil {
		return err
	}
	defer cluster.Close()
	fmt.Printf("kfake listening on %s (topics %s, %s%s); consumers: -broker kafka -kafka %s\n",
		strings.Join(cluster.ListenAddrs(), ","), name, name, idemkafka.DefaultDeadLetterSuffix, strings.Join(cluster.ListenAddrs(), ","))
	<-ctx.Done()
	return nil
}

func (c *consumer) runKafka(ctx context.Context, logger *slog.Logger) error {
	seeds := c.o.kafka
	if seeds == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, c.o.name, c.o.name+idemkafka.DefaultDeadLetterSuffix))
		if err != nil {
			return err
		}
		defer cluster.Close()
		seeds = strings.Join(cluster.ListenAddrs(), ",")
	}
	brokers := kgo.SeedBrokers(strings.Split(seeds, ",")...)
	producer, err := kgo.NewClient(brokers) // kgo's default: the idempotent producer, acks=all
	if err != nil {
		return err
	}
	defer producer.Close()
	if err := c.payments(ctx, c.o.name, idemkafka.NewPublisher(producer)); err != nil { // the topic is the subject
		return err
	}
	handle := func(ctx context.Context, r *kgo.Record) error {
		ctx = idemotel.ExtractTraceContext(ctx, func(k string) string {
			for _, h := range r.Headers {
				if h.Key == k {
					return string(h.Value)
				}
			}
			return ""
		})
		c.loseAck() // the idle clock; a Kafka test loses offset commits at the broker (kfake faults)
		if c.o.slow > 0 {
			// The tests check that no partition is handled by two consumers at once (below).
			fmt.Println("handling", r.Partition, time.Now().UnixNano())
			defer func() { fmt.Println("handled", r.Partition, time.Now().UnixNano()) }()
		}
		return c.sendReceipt(ctx, r.Value)
	}
	opts := []kgo.Opt{
		brokers, kgo.ConsumerGroup("receipts"), kgo.ConsumeTopics(c.o.name),
		kgo.SessionTimeout(c.o.session), kgo.RebalanceTimeout(c.o.session), kgo.HeartbeatInterval(c.o.session / 4), kgo.AutoCommitInterval(500 * time.Millisecond),
	}
	if c.o.ackDelay > 0 {
		opts = append(opts, kgo.Dialer(c.dialKafka))
	}
	if c.o.kafkaLog {
		prefix := fmt.Sprintf("kgo pid %d: ", os.Getpid())
		opts = append(opts, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelInfo, func() string { return time.Now().Format(time.StampMicro) + " " + prefix })))
	}
	if !c.o.useIdem {
		return c.consumeKafkaPlain(ctx, handle, opts)
	}
	key := idemkafka.HeaderOrPositionKey
	if c.o.slow > 0 {
		// The key is read at each attempt at a record, before idem: the
		// tests check that no consumer attempts a partition's record while
		// another runs a handler of that partition.
		key = func(r *kgo.Record) string {
			fmt.Println("attempt", r.Partition, time.Now().UnixNano())
			return idemkafka.HeaderOrPositionKey(r)
		}
	}
	kc := idemkafka.NewConsumer(c.engine, "send-receipt", handle, idemkafka.WithKey(key), idemkafka.WithRetryDelay(c.o.retryDelay), idemkafka.WithLogger(logger))
	cl, err := kgo.NewClient(append(kc.ClientOpts(), opts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Println("ready")
	kc.Run(ctx, cl)
	return nil
}

// consumeKafkaPlain is at-least-once handling without idem: each polled
// batch handled (a failed record retried in place), then its offsets
// committed.
func (c *consumer) consumeKafkaPlain(ctx context.Context, handle func(context.Context, *kgo.Record) error, opts []kgo.Opt) error {
	cl, err := kgo.NewClient(append(opts, kgo.DisableAutoCommit())...)
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Println("ready")
	for {
		fs := cl.PollFetches(ctx)
		if fs.IsClientClosed() || ctx.Err() != nil {
			return nil
		}
		for _, r := range fs.Records() {
			for handle(ctx, r) != nil && ctx.Err() == nil {
				time.Sleep(c.o.retryDelay)
			}
		}
		_ = cl.CommitUncommittedOffsets(ctx)
	}
}

// dialKafka dials a broker through a connection that pauses -ack-delay
// before each offset commit request it writes.
func (c *consumer) dialKafka(ctx context.Context, network, host string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return commitPause{Conn: conn, c: c}, nil
}

type commitPause struct {
	net.Conn
	c *consumer
}

// Write pauses before a request whose API key (after the 4-byte length)
// is OffsetCommit's: kgo writes each request whole.
func (w commitPause) Write(b []byte) (int, error) {
	if len(b) >= 6 && int16(binary.BigEndian.Uint16(b[4:6])) == int16(kmsg.OffsetCommit) {
		w.c.pauseBeforeAck()
	}
	return w.Conn.Write(b)
}
