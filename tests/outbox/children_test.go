package outboxtest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/adapters/idemkafka"
	"github.com/idemkit/idem/adapters/idemnats"
	"github.com/idemkit/idem/outbox"
)

// child runs this binary's role (handler or relay) and returns its exit code.
func child(role string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var err error
	switch role {
	case "handler":
		err = handlerChild(ctx)
	case "relay":
		err = relayChild(ctx)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, role+":", err)
		return 1
	}
	return 0
}

func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return n
}

func childDB(ctx context.Context) (*sql.DB, func(), error) {
	pool, err := pgxpool.New(ctx, os.Getenv("OB_PG"))
	if err != nil {
		return nil, nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	return db, func() { _ = db.Close(); pool.Close() }, nil
}

// handlerChild plays payments OB_FROM to OB_TO-1: each inserts a payment
// row and, with OB_MODE=outbox, enqueues its payment.created message in
// the same transaction; with OB_MODE=direct it publishes the message
// after the commit (the control). Every OB_ROLLBACK_EVERY-th payment rolls
// back. At payment OB_PAUSE_AT it prints "pausing" at OB_PAUSE
// (before-commit, after-commit) and waits to be killed.
func handlerChild(ctx context.Context) error {
	db, closeDB, err := childDB(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	ob, err := outbox.New(outbox.PostgreSQL, outbox.WithTable(os.Getenv("OB_TABLE")))
	if err != nil {
		return err
	}
	var js jetstream.JetStream
	if os.Getenv("OB_MODE") == "direct" {
		nc, err := nats.Connect(os.Getenv("OB_NATS"))
		if err != nil {
			return err
		}
		defer nc.Close()
		if js, err = jetstream.New(nc); err != nil {
			return err
		}
	}
	pause, pauseAt, every := os.Getenv("OB_PAUSE"), envInt("OB_PAUSE_AT"), envInt("OB_ROLLBACK_EVERY")
	fmt.Println("ready")
	for i := envInt("OB_FROM"); i < envInt("OB_TO"); i++ {
		id := fmt.Sprintf("%s_%05d", os.Getenv("OB_PREFIX"), i)
		m := outbox.Message{ID: "payment.created:" + id, Key: "customer" + strconv.Itoa(i%7), Subject: os.Getenv("OB_SUBJECT"), Payload: []byte(id)}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+os.Getenv("OB_PAY")+` (id) VALUES ($1)`, id); err != nil {
			return err
		}
		if os.Getenv("OB_MODE") == "outbox" {
			if err := ob.Enqueue(ctx, tx, m); err != nil {
				return err
			}
		}
		if pause == "before-commit" && i == pauseAt {
			fmt.Println("pausing", id)
			<-ctx.Done()
			return nil
		}
		if every > 0 && i%every == every-1 {
			if err := tx.Rollback(); err != nil {
				return err
			}
			continue
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		if pause == "after-commit" && i == pauseAt {
			fmt.Println("pausing", id)
			<-ctx.Done()
			return nil
		}
		if js != nil {
			if err := idemnats.NewPublisher(js).Publish(ctx, m); err != nil {
				return err
			}
		}
	}
	fmt.Println("done")
	return nil
}

// relayChild runs a relay on OB_TABLE until SIGTERM, publishing to the
// Kafka brokers OB_KAFKA (seed addresses, comma-separated) if set, else to
// the NATS servers OB_NATS, each publish bounded by OB_PUBLISH_TIMEOUT (a
// duration; 2s when unset). At its OB_PAUSE_AT-th publish it prints
// "pausing <message id>" at OB_PAUSE (before-publish; after-publish: sent,
// its confirmation not awaited; after-confirm: confirmed, the sent mark
// not committed) and waits to be killed.
func relayChild(ctx context.Context) error {
	db, closeDB, err := childDB(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	ob, err := outbox.New(outbox.PostgreSQL, outbox.WithTable(os.Getenv("OB_TABLE")))
	if err != nil {
		return err
	}
	var (
		p    outbox.Publisher // an outbox.BatchPublisher: pipelined waves
		send func(context.Context, outbox.Message) error
	)
	if seeds := os.Getenv("OB_KAFKA"); seeds != "" {
		cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(seeds, ",")...))
		if err != nil {
			return err
		}
		defer cl.Close()
		kp := idemkafka.NewPublisher(cl)
		p = kp
		send = func(ctx context.Context, m outbox.Message) error {
			go func() { _ = kp.Publish(context.WithoutCancel(ctx), m) }() // produced; its ack never reaches the relay
			return nil
		}
	} else {
		nc, err := nats.Connect(os.Getenv("OB_NATS"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		p = idemnats.NewPublisher(js)
		send = func(_ context.Context, m outbox.Message) error {
			msg := nats.NewMsg(m.Subject)
			msg.Data = m.Payload
			msg.Header.Set(jetstream.MsgIDHeader, m.ID)
			if err := nc.PublishMsg(msg); err != nil {
				return err
			}
			return nc.Flush() // on the wire; its PubAck never awaited
		}
	}
	if os.Getenv("OB_PAUSE") != "" {
		p = &pausingPublisher{inner: p, send: send, point: os.Getenv("OB_PAUSE"), at: int64(envInt("OB_PAUSE_AT"))}
	}
	timeout := 2 * time.Second
	if d := os.Getenv("OB_PUBLISH_TIMEOUT"); d != "" {
		if timeout, err = time.ParseDuration(d); err != nil {
			return err
		}
	}
	r, err := outbox.NewRelay(db, ob, p, outbox.WithBatchSize(max(1, envInt("OB_BATCH"))), outbox.WithWorkers(max(1, envInt("OB_WORKERS"))),
		outbox.WithPollInterval(20*time.Millisecond), outbox.WithBackoff(50*time.Millisecond, time.Second), outbox.WithPublishTimeout(timeout))
	if err != nil {
		return err
	}
	fmt.Println("ready")
	return r.Run(ctx)
}

// pausingPublisher publishes one message at a time through inner (no
// PublishBatch), pausing at its at-th: before publishing it, after send
// (the message sent, its confirmation not awaited), or after inner
// confirmed it.
type pausingPublisher struct {
	inner outbox.Publisher
	send  func(context.Context, outbox.Message) error
	point string
	at    int64
	n     atomic.Int64
}

func (p *pausingPublisher) Publish(ctx context.Context, m outbox.Message) error {
	if p.n.Add(1) != p.at {
		return p.inner.Publish(ctx, m)
	}
	switch p.point {
	case "after-publish":
		if err := p.send(ctx, m); err != nil {
			return err
		}
	case "after-confirm":
		if err := p.inner.Publish(ctx, m); err != nil {
			return err
		}
	}
	fmt.Println("pausing", m.ID)
	select {} // until SIGKILL
}
