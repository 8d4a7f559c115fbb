package payments

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/adapters/idemamqp"
	"github.com/idemkit/idem/adapters/idemnats"
	"github.com/idemkit/idem/observability/idemotel"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/pgstore"
)

// events publishes a payment.created event per payment through the
// transactional outbox (-outbox): Record enqueues it in the transaction
// that writes the payment row, and a relay publishes the committed ones
// to the broker in the shape and under the names examples/consumer reads
// (its -name is -outbox-name): the payment's JSON (Payment) on the subject
// NAME.payment.created of the JetStream stream NAME (NAME is -outbox-name
// upper-cased), or to the RabbitMQ queue -outbox-name through the default
// exchange; the message id is "payment.created:" + the payment id.
type events struct {
	ob      *outbox.Outbox
	subject string
	pg      *pgxpool.Pool // PostgreSQL ledger
	mysql   *sql.DB       // MySQL ledger
}

// record writes p's row (insert) and its payment.created event in one
// transaction: the execution's (pgstore.Tx, mysqlstore.Tx), or one of its
// own when there is none (-no-idem, or -payments-postgres with another
// store), so the event is published if and only if the row commits.
func (e *events) record(ctx context.Context, insert string, p Payment) error {
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	msg := outbox.Message{ID: "payment.created:" + p.ID, Key: p.ID, Subject: e.subject, Payload: body}
	write := func(tx outbox.Execer) error {
		if _, err := tx.ExecContext(ctx, insert, p.ID, p.UserID, p.Amount, p.Currency); err != nil {
			return err
		}
		return e.ob.Enqueue(ctx, tx, msg)
	}
	if e.pg != nil {
		tx, err := pgstore.Tx(ctx)
		switch {
		case errors.Is(err, pgstore.ErrNoExecution):
			return pgx.BeginFunc(ctx, e.pg, func(tx pgx.Tx) error { return write(outbox.Pgx(tx)) })
		case err != nil:
			return err
		}
		return write(outbox.Pgx(tx))
	}
	tx, err := mysqlstore.Tx(ctx)
	switch {
	case errors.Is(err, mysqlstore.ErrNoExecution):
		own, err := e.mysql.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := write(own); err != nil {
			_ = own.Rollback()
			return err
		}
		return own.Commit()
	case err != nil:
		return err
	}
	return write(tx)
}

// openOutbox sets up -outbox on l, whose payment rows live in pg
// (PostgreSQL) or my (MySQL): the outbox table <-outbox-name>_events
// (created if missing), the broker's stream or queue (declared if missing,
// as examples/consumer declares them), and a relay publishing until the
// returned function stops it. A broker or database that is down at
// start-up is retried by the relay with backoff.
func openOutbox(f Config, l *sqlLedger, pg *pgxpool.Pool, my *sql.DB) (stop func(), err error) {
	dialect, db := outbox.PostgreSQL, (*sql.DB)(nil)
	if pg != nil {
		db = stdlib.OpenDBFromPool(pg) // closing it leaves the pool open
	} else {
		// The relay reads DATETIME columns into time.Time: its own
		// connections, with parseTime.
		dialect = outbox.MySQL
		cfg, err := mysql.ParseDSN(f.MySQLDSN)
		if err != nil {
			return nil, fmt.Errorf("-mysql-dsn: %w", err)
		}
		cfg.ParseTime, cfg.Timeout = true, 2*time.Second
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, fmt.Errorf("-mysql-dsn: %w", err)
		}
		db = sql.OpenDB(conn)
	}
	defer func() {
		if err != nil {
			_ = db.Close()
		}
	}()
	ob, err := outbox.New(dialect, outbox.WithTable(f.OutboxName+"_events"), outbox.WithHeaders(idemotel.InjectTraceContext))
	if err != nil {
		return nil, fmt.Errorf("-outbox-name: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, subject, closePub, err := openPublisher(ctx, f)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			closePub()
		}
	}()
	if err := ob.EnsureSchema(ctx, db); err != nil {
		slog.Warn("outbox: creating the table failed; payments fail until it exists", "err", err)
	}
	observer, err := idemotel.NewOutboxObserver()
	if err != nil {
		return nil, err
	}
	relay, err := outbox.NewRelay(db, ob, pub, outbox.WithObserver(observer), outbox.WithPollInterval(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	l.events = &events{ob: ob, subject: subject, pg: pg, mysql: my}
	runCtx, stopRelay := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = relay.Run(runCtx) })
	return func() {
		stopRelay()
		wg.Wait()
		closePub()
		_ = db.Close()
	}, nil
}

// openPublisher returns the publisher -outbox names (nats:// or amqp://),
// the subject (or routing key) of payment.created, and what closes the
// publisher's connection.
func openPublisher(ctx context.Context, f Config) (outbox.Publisher, string, func(), error) {
	switch {
	case strings.HasPrefix(f.Outbox, "nats://"):
		// Connected in the background when the server is down at start-up.
		nc, err := nats.Connect(f.Outbox, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
		if err != nil {
			return nil, "", nil, fmt.Errorf("-outbox: %w", err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, "", nil, fmt.Errorf("-outbox: %w", err)
		}
		name := strings.ToUpper(f.OutboxName)
		if _, err := js.Stream(ctx, name); errors.Is(err, jetstream.ErrStreamNotFound) {
			_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
			if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				slog.Warn("outbox: creating the stream failed; the relay retries until it exists", "stream", name, "err", err)
			}
		} else if err != nil {
			slog.Warn("outbox: reading the stream failed; the relay retries until it exists", "stream", name, "err", err)
		}
		return idemnats.NewPublisher(js), name + ".payment.created", nc.Close, nil
	case strings.HasPrefix(f.Outbox, "amqp://"), strings.HasPrefix(f.Outbox, "amqps://"):
		if conn, err := amqp.Dial(f.Outbox); err != nil {
			slog.Warn("outbox: RabbitMQ is down; the relay retries", "err", err)
		} else {
			ch, err := conn.Channel()
			if err == nil {
				_, err = ch.QueueDeclare(f.OutboxName, true, false, false, false, nil)
			}
			if err != nil {
				slog.Warn("outbox: declaring the queue failed; the relay retries until it exists", "queue", f.OutboxName, "err", err)
			}
			_ = conn.Close()
		}
		pub := idemamqp.NewPublisher(func() (*amqp.Connection, error) { return amqp.Dial(f.Outbox) }, "")
		return pub, f.OutboxName, func() { _ = pub.Close() }, nil // the default exchange routes to the queue by name
	}
	return nil, "", nil, fmt.Errorf("-outbox %q: want a nats:// or amqp:// URL", f.Outbox)
}
