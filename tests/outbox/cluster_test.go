package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/adapters/idemnats"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/stores/pgstore"
)

// producer is the handler side in process: an idem engine on pgstore
// whose handler writes a payment row and enqueues its message through
// the execution's transaction (pgstore.Tx, outbox.Pgx).
type producer struct {
	t        testing.TB
	pool     *pgxpool.Pool
	engine   *idem.Engine
	ob       *outbox.Outbox
	payTable string // quoted
	prefix   string
	subj     string
}

func newProducer(t testing.TB, pool *pgxpool.Pool, ob *outbox.Outbox, subject string) *producer {
	name := uniq("prod")
	store := pgstore.New(pool, pgstore.WithTable(name+"_idem"))
	ctx := ctxT(t, 30*time.Second)
	if err := store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	p := &producer{t: t, pool: pool, ob: ob, payTable: pgx.Identifier{name}.Sanitize(), prefix: name, subj: subject}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+p.payTable+` (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	var err error
	if p.engine, err = idem.New(store); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.engine.Close(ctx)
		_ = store.Close()
		for _, tb := range []string{name, name + "_idem"} {
			_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{tb}.Sanitize())
		}
	})
	return p
}

var errDeclined = errors.New("payment declined")

// pay runs payment i through idem: every 5th is declined, its transaction
// rolled back with its message.
func (p *producer) pay(ctx context.Context, i int) error {
	id := fmt.Sprintf("%s_%05d", p.prefix, i)
	_, err := idem.Do(ctx, p.engine, idem.Operation{Name: "pay", Key: id}, func(ctx context.Context) (struct{}, error) {
		tx, err := pgstore.Tx(ctx)
		if err != nil {
			return struct{}{}, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+p.payTable+` (id) VALUES ($1)`, id); err != nil {
			return struct{}{}, err
		}
		m := outbox.Message{ID: "payment.created:" + id, Key: "customer" + strconv.Itoa(i%7), Subject: p.subj, Payload: []byte(id)}
		if err := p.ob.Enqueue(ctx, outbox.Pgx(tx), m); err != nil {
			return struct{}{}, err
		}
		if i%5 == 4 {
			return struct{}{}, errDeclined
		}
		return struct{}{}, nil
	})
	if errors.Is(err, errDeclined) {
		return nil
	}
	return err
}

func (p *producer) committed() []string {
	rows, err := p.pool.Query(context.Background(), `SELECT 'payment.created:' || id FROM `+p.payTable)
	if err != nil {
		p.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		p.t.Fatal(err)
	}
	return ids
}

// checkStreamOrder reads the stream and fails when a key's payments are
// out of their enqueue order, and returns how many messages it holds.
func checkStreamOrder(t testing.TB, js jetstream.JetStream, stream string) int {
	t.Helper()
	// Creating the consumer right after a leader change can wait for the
	// cluster until its context ends (seen once in make test): each
	// attempt gets 10s, the whole 2 minutes.
	var oc jetstream.Consumer
	waitFor(t, "an ordered consumer of the stream", 2*time.Minute, func() bool {
		var err error
		oc, err = js.OrderedConsumer(ctxT(t, 10*time.Second), stream, jetstream.OrderedConsumerConfig{})
		return err == nil
	})
	last := map[string]int{}
	n := 0
	for {
		batch, err := oc.FetchNoWait(500)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			n++
			id := string(msg.Data())
			i, _ := strconv.Atoi(id[strings.LastIndexByte(id, '_')+1:])
			key := i % 7
			if prev, ok := last[strconv.Itoa(key)]; ok && prev >= i {
				t.Errorf("stream order: payment %d after %d, same key", i, prev)
			}
			last[strconv.Itoa(key)] = i
		}
		if got == 0 {
			return n
		}
	}
}

// TestClusterRelay relays payments committed through idem (pgstore.Tx)
// to an R3 stream on a 3-node JetStream cluster started here, with two
// relays, while the stream's leader is SIGKILLed and restarted mid-stream
// and the leadership moved by $JS.API.STREAM.LEADER.STEPDOWN; idemnats
// consumes it. Every committed payment yields exactly one effect, no
// declined one any, and the stream holds each key's messages in order.
func TestClusterRelay(t *testing.T) {
	n := 300
	if *soak {
		n = 3000
	}
	nodes := startNATS(t, 3)
	nc, js := connect(t, urls(nodes))
	name := strings.ToUpper(uniq("r3"))
	stream := createStream(t, js, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Replicas: 3, Storage: jetstream.FileStorage})
	db, pool := openDB(t, outbox.PostgreSQL)
	ob := newOutbox(t, db, outbox.PostgreSQL)
	fx := newEffects(t, pool)
	cons := consumeNATS(t, stream, fx.natsHandler())
	prod := newProducer(t, pool, ob, name+".payment.created")

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	_, pubJS := connect(t, urls(nodes))
	for range 2 {
		r, err := outbox.NewRelay(db, ob, idemnats.NewPublisher(pubJS), outbox.WithWorkers(2), outbox.WithBatchSize(20),
			outbox.WithPollInterval(20*time.Millisecond), outbox.WithBackoff(50*time.Millisecond, time.Second), outbox.WithPublishTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(ctx) }()
	}
	defer func() { cancel(); wg.Wait() }()

	produced := make(chan error, 1)
	go func() {
		for i := range n {
			if err := prod.pay(context.Background(), i); err != nil {
				produced <- err
				return
			}
			time.Sleep(2 * time.Millisecond) // a stream, not one burst
		}
		produced <- nil
	}()
	leader := func() *natsNode {
		var l *natsNode
		waitFor(t, "a stream leader", 60*time.Second, func() bool {
			info, err := stream.Info(ctxT(t, 5*time.Second))
			if err != nil || info.Cluster == nil {
				return false
			}
			for _, node := range nodes {
				if node.name == info.Cluster.Leader {
					l = node
				}
			}
			return l != nil
		})
		return l
	}
	progress := func(k int) {
		waitFor(t, fmt.Sprintf("%d effects", k), 120*time.Second, func() bool { return len(fx.counts()) >= k })
	}
	progress(n / 8)
	killed := leader()
	killed.kill()
	progress(n / 3)
	killed.start()
	progress(n / 2)
	from := leader()
	waitFor(t, "the stream leader stepped down", 60*time.Second, func() bool {
		_, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+name, nil, 5*time.Second)
		return err == nil
	})
	to := leader()
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an empty outbox", 120*time.Second, func() bool { return unsent(t, db, ob.Table()) == 0 })
	waitFor(t, "every message acked", 120*time.Second, func() bool {
		info, err := cons.Info(ctxT(t, 5*time.Second))
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	want := prod.committed()
	fx.checkExactlyOnce(want)
	stored := checkStreamOrder(t, js, name)
	t.Logf("%d payments, %d committed, %d effects, %d stored; leader %s killed and restarted, leadership moved from %s to %s",
		n, len(want), len(fx.counts()), stored, killed.name, from.name, to.name)
}
