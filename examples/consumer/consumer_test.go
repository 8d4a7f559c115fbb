package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/examples/internal/procs"
)

// The broker chaos tests: N payments published, some of them twice with
// the same message id, handled by consumer processes that are SIGKILLed
// mid-handler (after their outbox write, before its commit) and between
// the commit and the ack, that lose acks (NATS: not sent, redelivered
// after AckWait; RabbitMQ: channel closed without them, requeued), three
// competing at a time. Exactly N receipts must be in the outbox. The same
// run without idem (one process, no kills) must show more, so the count
// can fail.
// make test plays 30 payments and 6 kills; make soak passes larger -payments and -kills.
var (
	payments   = flag.Int("payments", 30, "payments published")
	duplicates = flag.Int("duplicates", 10, "payments published a second time")
	kills      = flag.Int("kills", 6, "consumers SIGKILLed, alternately mid-handler and between commit and ack")
)

const instances = 3

var (
	bin         string // the consumer, built once
	paymentsBin string // examples/payments, for the payments service tests
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-consumer")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	bin, err = procs.Build(ctx, dir, "consumer")
	if err == nil {
		paymentsBin, err = procs.Build(ctx, dir, "payments")
	}
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func TestExactlyOnceNATS(t *testing.T) { testExactlyOnce(t, "nats") }

func TestExactlyOnceAMQP(t *testing.T) { testExactlyOnce(t, "amqp") }

func testExactlyOnce(t *testing.T, broker string) {
	chaos := chaos
	if broker == "kafka" {
		chaos = chaosKafka // kafka_test.go
	}
	t.Run("idem", func(t *testing.T) {
		total, distinct := chaos(t, broker, true)
		if total != *payments || distinct != *payments {
			t.Fatalf("%d receipts for %d distinct payments, want exactly %d", total, distinct, *payments)
		}
	})
	t.Run("without idem", func(t *testing.T) {
		total, distinct := chaos(t, broker, false)
		if distinct != *payments || total <= *payments {
			t.Fatalf("%d receipts for %d distinct payments: the run without idem should send more than %d", total, distinct, *payments)
		}
	})
}

// chaos plays the run on broker and returns the outbox's rows and distinct
// payments.
func chaos(t *testing.T, broker string, useIdem bool) (total, distinct int) {
	w := newWorld(t, broker)
	w.publish()
	common := []string{"-idem=" + fmt.Sprint(useIdem), "-prefetch", "1", "-ack-wait", "1s", "-lease", "2s", "-store-timeout", "500ms", "-retry-delay", "200ms"}
	failing := append([]string{"-slow", "200ms", "-ack-delay", "200ms", "-lose-acks", "5"}, common...)
	running := make([]*proc, instances)
	for i := range running {
		running[i] = w.start(failing...)
	}
	for k := range *kills {
		i := k % instances
		mark := "wrote " // mid-handler: the outbox row is written, not committed
		if k%2 == 1 {
			mark = "acking" // the record and the row are committed, the ack not sent
		}
		running[i].waitLine(t, mark)
		running[i].kill()
		running[i] = w.start(failing...)
	}
	w.waitReceipts(*payments)
	for _, p := range running {
		p.stop()
	}
	w.drain(common...)
	total, distinct = w.count()
	t.Logf("%s, idem %v: %d receipts for %d payments (%d published twice, %d instances, %d kills, every 5th ack lost)",
		broker, useIdem, total, distinct, *duplicates, instances, *kills)
	return total, distinct
}

// world is one run's broker objects and tables, all under a random name,
// removed at the end of the test.
type world struct {
	t      *testing.T
	broker string
	name   string
	pool   *pgxpool.Pool
	js     jetstream.JetStream
	ch     *amqp.Channel
	logs   string
	kafka  *kafkaWorld // kafka_test.go
	procs  []*proc     // every consumer started
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newWorld(t *testing.T, broker string) *world {
	w := &world{t: t, broker: broker, name: "idemchaos_" + strings.ToLower(rand.Text()[:10]), logs: filepath.Join(t.TempDir(), "consumers.log")}
	ctx := ctxT(t)
	pgURL := env("IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
	var err error
	if w.pool, err = pgxpool.New(ctx, pgURL); err == nil {
		err = w.pool.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("PostgreSQL at %s: %v (scripts/services.sh starts one)", pgURL, err)
	}
	t.Cleanup(func() {
		for _, table := range []string{w.name + "_idem", w.name + "_outbox"} {
			_, _ = w.pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{table}.Sanitize())
		}
		w.pool.Close()
	})
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(w.logs)
			t.Logf("consumer logs:\n%s", b)
		}
	})
	switch broker {
	case "nats":
		url := env("IDEM_NATS_URL", nats.DefaultURL)
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatalf("NATS at %s: %v (scripts/services.sh starts one)", url, err)
		}
		t.Cleanup(nc.Close)
		w.js, _ = jetstream.New(nc)
		stream := strings.ToUpper(w.name)
		// A short duplicate window, so that the copies published after it
		// reach the consumers, as any copy does after the default 2 minutes.
		if _, err := w.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}, Duplicates: 100 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.js.DeleteStream(context.Background(), stream) })
	case "amqp":
		url := env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Fatalf("RabbitMQ at %s: %v (scripts/services.sh starts one)", url, err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		if w.ch, err = conn.Channel(); err != nil {
			t.Fatal(err)
		}
		if _, err := w.ch.QueueDeclare(w.name, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = w.ch.QueueDelete(w.name, false, false, false) })
	case "kafka":
		w.kafka = newKafka(t, w.name)
	}
	return w
}

// publish publishes the payments, then the first duplicates of them again
// with the same message ids.
func (w *world) publish() {
	ps := samplePayments(*payments)
	w.send(ps)
	if w.broker == "nats" {
		time.Sleep(300 * time.Millisecond) // past the stream's duplicate window (100ms)
	}
	w.send(ps[:min(*duplicates, len(ps))])
}

func (w *world) send(ps []Payment) {
	if w.kafka != nil {
		w.kafka.send(ps)
		return
	}
	ctx := ctxT(w.t)
	for _, p := range ps {
		b, _ := json.Marshal(p)
		var err error
		switch w.broker {
		case "nats":
			msg := nats.NewMsg(strings.ToUpper(w.name) + ".succeeded")
			msg.Data = b
			msg.Header.Set(jetstream.MsgIDHeader, p.ID)
			_, err = w.js.PublishMsg(ctx, msg)
		case "amqp":
			err = w.ch.PublishWithContext(ctx, "", w.name, false, false, amqp.Publishing{MessageId: p.ID, DeliveryMode: amqp.Persistent, Body: b})
		}
		if err != nil {
			w.t.Fatal(err)
		}
	}
}

// count returns the outbox's rows and distinct payments.
func (w *world) count() (total, distinct int) {
	err := w.pool.QueryRow(ctxT(w.t), `SELECT count(*), count(DISTINCT payment_id) FROM `+pgx.Identifier{w.name + "_outbox"}.Sanitize()).Scan(&total, &distinct)
	if err != nil {
		w.t.Fatal(err)
	}
	return total, distinct
}

// waitReceipts waits until the outbox has a receipt for n payments.
func (w *world) waitReceipts(n int) {
	waitFor(w.t, fmt.Sprintf("receipts for %d payments", n), func() bool { _, d := w.count(); return d >= n })
}

// drain runs one consumer without injected failures until the broker holds
// nothing more for it: every message acked (or terminated).
func (w *world) drain(args ...string) {
	switch w.broker {
	case "nats":
		p := w.start(args...)
		defer p.stop()
		waitFor(w.t, "every message acked", func() bool {
			cons, err := w.js.Consumer(ctxT(w.t), strings.ToUpper(w.name), "receipts")
			if err != nil {
				w.t.Fatal(err)
			}
			info, err := cons.Info(ctxT(w.t))
			if err != nil {
				w.t.Fatal(err)
			}
			return info.NumPending == 0 && info.NumAckPending == 0
		})
	case "kafka":
		p := w.start(args...)
		defer p.stop()
		w.kafka.drained()
	case "amqp": // unacked deliveries show only once their channel closes
		waitFor(w.t, "every delivery acked", func() bool {
			p := w.start(args...)
			waitFor(w.t, "an empty queue", func() bool { return w.ready() == 0 })
			p.stop()
			return w.ready() == 0
		})
	}
}

func (w *world) ready() int {
	q, err := w.ch.QueueDeclarePassive(w.name, true, false, false, false, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	return q.Messages
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second) // a hang guard only
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// proc is a running consumer process.
type proc struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}

	mu       sync.Mutex
	spans    []span        // Kafka: its handlers' runs ("handling"/"handled" lines)
	attempts []span        // Kafka: its attempts at records ("attempt" lines; start only)
	handling map[int32]int // Kafka: partition -> index in spans of the run not ended
	lost     []time.Time   // Kafka: when it logged partitions lost
}

// span is one run of a handler of a Kafka consumer: partition and start
// and end times, as the process printed them (end: its exit when the run
// did not end).
type span struct {
	partition  int32
	start, end time.Time
}

// start runs the consumer on w's broker objects and waits for its "ready" line.
func (w *world) start(args ...string) *proc {
	w.t.Helper()
	base := []string{"-broker", w.broker, "-name", w.name}
	if w.kafka != nil {
		base = append(base, w.kafka.args()...)
	}
	cmd := exec.Command(bin, append(base, args...)...)
	logs, err := os.OpenFile(w.logs, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		w.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	errOut, err := cmd.StderrPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan string, 1024), done: make(chan struct{}), handling: map[int32]int{}}
	stderrDone := make(chan struct{})
	go func() { // the logs, to the run's log file
		defer close(stderrDone)
		defer logs.Close()
		sc := bufio.NewScanner(errOut)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			l := sc.Text()
			if strings.Contains(l, "idemkafka: partitions lost") {
				p.mu.Lock()
				p.lost = append(p.lost, time.Now())
				p.mu.Unlock()
			}
			_, _ = fmt.Fprintln(logs, l)
		}
	}()
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			l := sc.Text()
			p.record(l)
			select {
			case p.lines <- l:
			default: // nobody reads: drop
			}
		}
		<-stderrDone
		_ = cmd.Wait()
		p.record("exited")
		close(p.done)
	}()
	w.procs = append(w.procs, p)
	w.t.Cleanup(p.kill)
	p.waitLine(w.t, "ready")
	return p
}

// record notes a handler's start or end (Kafka, with -slow), or, for
// "exited", ends the runs the process did not end.
func (p *proc) record(l string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l == "exited" {
		for _, i := range p.handling {
			p.spans[i].end = time.Now()
		}
		clear(p.handling)
		return
	}
	var what string
	var part int32
	var nanos int64
	if n, _ := fmt.Sscanf(l, "%s %d %d", &what, &part, &nanos); n != 3 {
		return
	}
	switch what {
	case "attempt":
		p.attempts = append(p.attempts, span{partition: part, start: time.Unix(0, nanos)})
	case "handling":
		p.handling[part] = len(p.spans)
		p.spans = append(p.spans, span{partition: part, start: time.Unix(0, nanos)})
	case "handled":
		if i, ok := p.handling[part]; ok {
			p.spans[i].end = time.Unix(0, nanos)
			delete(p.handling, part)
		}
	}
}

// waitLine waits for the next output line starting with prefix, dropping
// the lines before it.
func (p *proc) waitLine(t *testing.T, prefix string) {
	t.Helper()
	timeout := time.After(60 * time.Second) // a hang guard only
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-p.done:
			t.Fatalf("consumer exited before printing %q", prefix)
		case <-timeout:
			t.Fatalf("consumer printed no %q line", prefix)
		}
	}
}

// kill SIGKILLs the process (no deferred code, no ack, no release runs).
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// stop shuts the process down with SIGTERM.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.kill()
	}
}

// TestRelayedNATS and TestRelayedAMQP run the command as documented
// (-publish): payments committed with their payment.created events in an
// outbox, relayed to the broker, consumed with idem: one receipt each.
func TestRelayedNATS(t *testing.T) { testRelayed(t, "nats") }

func TestRelayedAMQP(t *testing.T) { testRelayed(t, "amqp") }

func testRelayed(t *testing.T, broker string) {
	w := newWorld(t, broker)
	t.Cleanup(func() {
		for _, table := range []string{w.name + "_events", w.name + "_events_partitions", w.name + "_payments"} {
			_, _ = w.pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{table}.Sanitize())
		}
	})
	out, err := exec.Command(bin, "-broker", broker, "-name", w.name, "-publish", "5").CombinedOutput()
	if err != nil {
		t.Fatalf("consumer -publish 5: %v\n%s", err, out)
	}
	if total, distinct := w.count(); total != 5 || distinct != 5 {
		t.Fatalf("%d receipts for %d payments, want 5 for 5\n%s", total, distinct, out)
	}
	// Again on the same tables: the count printed is this run's only.
	out, err = exec.Command(bin, "-broker", broker, "-name", w.name, "-publish", "5").CombinedOutput()
	if err != nil {
		t.Fatalf("consumer -publish 5, a second time: %v\n%s", err, out)
	}
	if want := "5 receipts for this run's 5 payments in "; !strings.Contains(string(out), want) {
		t.Errorf("a second run printed no %q:\n%s", want, out)
	}
	if total, distinct := w.count(); total != 10 || distinct != 10 {
		t.Fatalf("%d receipts for %d payments after two runs, want 10 for 10\n%s", total, distinct, out)
	}
	var unsent int
	if err := w.pool.QueryRow(ctxT(t), `SELECT count(*) FROM `+pgx.Identifier{w.name + "_events"}.Sanitize()+` WHERE sent_at IS NULL`).Scan(&unsent); err != nil || unsent != 0 {
		t.Fatalf("%d events unsent (%v), want 0", unsent, err)
	}
}
