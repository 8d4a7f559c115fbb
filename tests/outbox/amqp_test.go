package outboxtest

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/adapters/idemamqp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/stores/mysqlstore"
)

// cutProxy forwards a loopback port to upstream until cut, which closes
// the listener and every connection (the broker unreachable); restore
// listens again on the same port.
type cutProxy struct {
	t        testing.TB
	addr     string
	upstream string
	mu       sync.Mutex
	ln       net.Listener
	conns    []net.Conn
	wg       sync.WaitGroup
}

func newCutProxy(t testing.TB, upstream string) *cutProxy {
	p := &cutProxy{t: t, addr: "127.0.0.1:" + strconv.Itoa(freePort(t)), upstream: upstream}
	p.restore()
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) restore() {
	var ln net.Listener
	waitFor(p.t, "the proxy listening", 10*time.Second, func() bool {
		var err error
		ln, err = net.Listen("tcp", p.addr)
		return err == nil
	})
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(u, c); _ = u.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, u); _ = c.Close() }()
		}
	}()
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// amqpWorld is a RabbitMQ queue of its own, consumed through idemamqp by
// the effects consumer, counting deliveries.
type amqpWorld struct {
	queue      string
	fx         *effects
	deliveries atomic.Int64
	conn       *amqp.Connection
}

func newAMQPWorld(t testing.TB) *amqpWorld {
	t.Helper()
	_, pool := openDB(t, outbox.PostgreSQL)
	w := &amqpWorld{queue: uniq("q"), fx: newEffects(t, pool)}
	var err error
	if w.conn, err = amqp.Dial(amqpURL()); err != nil {
		t.Fatalf("RabbitMQ at %s: %v (scripts/services.sh starts one)", amqpURL(), err)
	}
	t.Cleanup(func() { _ = w.conn.Close() })
	ch, err := w.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(w.queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := w.conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(w.queue, false, false, false)
		}
	})
	if err := ch.Qos(32, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(w.queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := w.fx.amqpHandler()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			w.deliveries.Add(1)
			h(ctx, d)
		}
	}()
	t.Cleanup(func() { cancel(); _ = ch.Close(); <-done })
	return w
}

// mysqlProducer commits payments through idem on mysqlstore, enqueuing
// each message in the execution's transaction (mysqlstore.Tx); every 5th
// is declined and rolled back.
func mysqlProducer(t testing.TB, db *sql.DB, ob *outbox.Outbox, queue string, n int) []string {
	t.Helper()
	table := uniq("idem")
	store := mysqlstore.New(db, mysqlstore.WithTable(table))
	ctx := ctxT(t, 120*time.Second)
	if err := store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = store.Close()
		dropTables(db, table)
		_, _ = db.ExecContext(context.Background(), "DROP PROCEDURE IF EXISTS `"+table+mysqlstore.ProcSuffix+"`")
	})
	engine, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = engine.Close(ctx) }()
	var committed []string
	for i, id := range paymentIDs(n) {
		_, err := idem.Do(ctx, engine, idem.Operation{Name: "pay", Key: id}, func(ctx context.Context) (struct{}, error) {
			tx, err := mysqlstore.Tx(ctx)
			if err != nil {
				return struct{}{}, err
			}
			m := outbox.Message{ID: "payment.created:" + id, Key: "customer" + strconv.Itoa(i%7), Subject: queue, Payload: []byte(id),
				Headers: map[string]string{"content-type": "text/plain"}}
			if err := ob.Enqueue(ctx, tx, m); err != nil {
				return struct{}{}, err
			}
			if i%5 == 4 {
				return struct{}{}, errDeclined
			}
			return struct{}{}, nil
		})
		switch {
		case errors.Is(err, errDeclined):
		case err != nil:
			t.Fatal(err)
		default:
			committed = append(committed, "payment.created:"+id)
		}
	}
	return committed
}

// TestAMQPRelay relays payments committed through idem on MariaDB
// (mysqlstore.Tx) to RabbitMQ with publisher confirms, through a proxy
// cut for a while (the broker unreachable: the relay backs off and dials
// again); then marks some sent messages unsent again, as a relay killed
// between the confirm and its sent mark leaves them, so they are published
// twice: idemamqp dedupes the copies by message-id. Every committed
// payment yields exactly one effect.
func TestAMQPRelay(t *testing.T) {
	n := 100
	w := newAMQPWorld(t)
	db, _ := openDB(t, outbox.MySQL)
	ob := newOutbox(t, db, outbox.MySQL)
	want := mysqlProducer(t, db, ob, w.queue, n)
	proxy := newCutProxy(t, amqpHost(t))
	pub := idemamqp.NewPublisher(func() (*amqp.Connection, error) { return amqp.Dial(amqpViaProxy(t, proxy.addr)) }, "")
	defer pub.Close()
	r, err := outbox.NewRelay(db, ob, pub, outbox.WithBatchSize(10), outbox.WithLogger(quiet),
		outbox.WithPollInterval(20*time.Millisecond), outbox.WithBackoff(20*time.Millisecond, 500*time.Millisecond), outbox.WithPublishTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 120*time.Second)
	if _, err := r.RelayOnce(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.cut()
	if p, err := r.RelayOnce(ctx); err == nil || p != 0 {
		t.Fatalf("RelayOnce with the broker unreachable = %d, %v; want 0 and an error", p, err)
	}
	proxy.restore()
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, "an empty outbox", 60*time.Second, func() bool { return unsent(t, db, ob.Table()) == 0 })
	waitFor(t, "an effect per committed payment", 60*time.Second, func() bool { return len(w.fx.counts()) == len(want) })
	again, err := db.ExecContext(ctx, "UPDATE "+ob.Table()+" SET sent_at = NULL WHERE id % 4 = 0 AND sent_at IS NOT NULL")
	if err != nil {
		t.Fatal(err)
	}
	republished, _ := again.RowsAffected()
	waitFor(t, "an empty outbox again", 60*time.Second, func() bool { return unsent(t, db, ob.Table()) == 0 })
	waitFor(t, "every delivery handled", 60*time.Second, func() bool { return w.deliveries.Load() >= int64(len(want))+republished })
	w.fx.checkExactlyOnce(want)
	t.Logf("%d payments, %d committed, %d republished: %d deliveries, %d effects", n, len(want), republished, w.deliveries.Load(), len(w.fx.counts()))
}

func amqpHost(t testing.TB) string {
	u, err := amqp.ParseURI(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}

func amqpViaProxy(t testing.TB, addr string) string {
	u, err := amqp.ParseURI(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	u.Host = host
	u.Port, _ = strconv.Atoi(port)
	return u.String()
}
