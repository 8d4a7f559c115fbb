package outboxtest

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/adapters/idemamqp"
	"github.com/idemkit/idem/adapters/idemnats"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/pgstore"
)

// --- the consumer: idem's helpers applying one effect row per message ---

// effects is the consumer side: an idem engine on pgstore whose handler
// writes one row per message id into an effects table in the execution's
// transaction.
type effects struct {
	t      testing.TB
	pool   *pgxpool.Pool
	table  string // quoted
	engine *idem.Engine
}

func newEffects(t testing.TB, pool *pgxpool.Pool) *effects {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	name := uniq("fx")
	store := pgstore.New(pool, pgstore.WithTable(name+"_idem"))
	if err := store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	e := &effects{t: t, pool: pool, table: pgx.Identifier{name}.Sanitize()}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+e.table+` (n bigserial PRIMARY KEY, msg_id text NOT NULL, body text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.engine, err = idem.New(store, idem.WithLease(8*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.engine.Close(ctx)
		_ = store.Close()
		for _, tb := range []string{name, name + "_idem"} {
			_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{tb}.Sanitize())
		}
	})
	return e
}

func (e *effects) apply(ctx context.Context, id string, body []byte) error {
	tx, err := pgstore.Tx(ctx)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+e.table+` (msg_id, body) VALUES ($1, $2)`, id, string(body))
	return err
}

// natsHandler applies each JetStream message once, by its Nats-Msg-Id.
func (e *effects) natsHandler() jetstream.MessageHandler {
	return idemnats.Handler(e.engine, "apply", func(ctx context.Context, msg jetstream.Msg) error {
		return e.apply(ctx, msg.Headers().Get(jetstream.MsgIDHeader), msg.Data())
	}, idemnats.WithRetryDelay(100*time.Millisecond))
}

// amqpHandler applies each delivery once, by its message-id.
func (e *effects) amqpHandler() func(context.Context, amqp.Delivery) {
	return idemamqp.Handler(e.engine, "apply", func(ctx context.Context, d amqp.Delivery) error {
		return e.apply(ctx, d.MessageId, d.Body)
	}, idemamqp.WithRetryDelay(100*time.Millisecond))
}

// counts returns how many effects each message id has.
func (e *effects) counts() map[string]int {
	rows, err := e.pool.Query(context.Background(), `SELECT msg_id, count(*) FROM `+e.table+` GROUP BY msg_id`)
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv [2]any, err error) {
		var id string
		var n int
		err = r.Scan(&id, &n)
		return [2]any{id, n}, err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	out := make(map[string]int, len(m))
	for _, kv := range m {
		out[kv[0].(string)] = kv[1].(int)
	}
	return out
}

// checkExactlyOnce fails unless every id in want has exactly one effect
// and no other id has any.
func (e *effects) checkExactlyOnce(want []string) {
	e.t.Helper()
	got := e.counts()
	wantSet := make(map[string]bool, len(want))
	for _, id := range want {
		wantSet[id] = true
		if got[id] != 1 {
			e.t.Errorf("message %s: %d effects, want 1", id, got[id])
		}
	}
	for id, n := range got {
		if !wantSet[id] {
			e.t.Errorf("message %s of no committed payment: %d effects", id, n)
		}
	}
}

// --- NATS servers started by the tests ---

// freePort returns a loopback TCP port free at the time of the call.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// natsNode is one nats-server process with JetStream and its own store
// directory, restartable on the same ports and data.
type natsNode struct {
	t    testing.TB
	name string
	port int
	args []string
	cmd  *exec.Cmd
	done chan struct{}
	logs *os.File
}

func (n *natsNode) url() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

func (n *natsNode) start() {
	n.t.Helper()
	n.cmd = exec.Command(natsServerBin(), n.args...)
	n.cmd.Stdout, n.cmd.Stderr = n.logs, n.logs
	if err := n.cmd.Start(); err != nil {
		n.t.Fatalf("start nats-server: %v", err)
	}
	done := make(chan struct{})
	n.done = done
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(done) }(n.cmd)
	waitFor(n.t, n.name+" listening", 30*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(n.port), time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
}

// kill SIGKILLs the server (a crash: its store is what reached the disk).
func (n *natsNode) kill() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.done
	n.cmd = nil
}

func natsServerBin() string { return env("IDEM_NATS_SERVER", "/usr/sbin/nats-server") }

// startNATS starts n JetStream servers on free loopback ports, clustered
// when n > 1 (every node routes to every other), each with a store
// directory in t.TempDir; t's cleanup kills them.
func startNATS(t testing.TB, n int) []*natsNode {
	t.Helper()
	dir := t.TempDir()
	logs, err := os.Create(dir + "/nats.log")
	if err != nil {
		t.Fatal(err)
	}
	cluster := uniq("c")
	nodes := make([]*natsNode, n)
	cports := make([]int, n)
	for i := range nodes {
		nodes[i] = &natsNode{t: t, name: fmt.Sprintf("%s_n%d", cluster, i), port: freePort(t), logs: logs}
		cports[i] = freePort(t)
	}
	var routes []string
	for _, p := range cports {
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(p))
	}
	for i, node := range nodes {
		node.args = []string{"-a", "127.0.0.1", "-p", strconv.Itoa(node.port), "-n", node.name, "-js", "-sd", fmt.Sprintf("%s/store%d", dir, i)}
		if n > 1 {
			node.args = append(node.args, "--cluster_name", cluster, "--cluster", routes[i], "--routes", strings.Join(routes, ","))
		}
	}
	t.Cleanup(func() {
		for _, node := range nodes {
			node.kill()
		}
		_ = logs.Close()
		if t.Failed() {
			b, _ := os.ReadFile(dir + "/nats.log")
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("nats-server logs (tail):\n%s", b)
		}
	})
	for _, node := range nodes {
		node.start()
	}
	return nodes
}

func urls(nodes []*natsNode) string {
	var u []string
	for _, n := range nodes {
		u = append(u, n.url())
	}
	return strings.Join(u, ",")
}

// connect connects to servers, reconnecting forever; t's cleanup closes it.
func connect(t testing.TB, servers string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(servers, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatalf("NATS at %s: %v", servers, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// createStream creates cfg, retrying while the cluster elects its meta
// leader; t's cleanup deletes it.
func createStream(t testing.TB, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	var s jetstream.Stream
	waitFor(t, "stream "+cfg.Name+" created", 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		s, err = js.CreateOrUpdateStream(ctx, cfg)
		return err == nil
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, cfg.Name)
	})
	return s
}

// consumeNATS consumes stream with a durable consumer through h until t
// ends.
func consumeNATS(t testing.TB, s jetstream.Stream, h jetstream.MessageHandler) jetstream.Consumer {
	t.Helper()
	var cons jetstream.Consumer
	waitFor(t, "consumer created", 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		cons, err = s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: "effects", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxAckPending: 64,
		})
		return err == nil
	})
	cc, err := cons.Consume(h, jetstream.PullMaxMessages(32), jetstream.PullHeartbeat(time.Second), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Stop(); <-cc.Closed() })
	return cons
}

// --- child processes: this test binary re-executed in a role ---

const childEnv = "IDEM_OUTBOX_CHILD"

// proc is a running child process whose stdout lines the test reads.
type proc struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
}

// childLogs returns a file in t.TempDir for children's stderr, logged
// when t fails.
func childLogs(t testing.TB) *os.File {
	t.Helper()
	logs, err := os.Create(filepath.Join(t.TempDir(), "children.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = logs.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("children's logs:\n%s", b)
		}
	})
	return logs
}

// startChild runs this test binary in role with the given environment.
func startChild(t testing.TB, logs *os.File, role string, envs ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+role), envs...)
	cmd.Stderr = logs
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan string, 100000), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

// waitLine waits for an output line starting with prefix and returns it.
func (p *proc) waitLine(t testing.TB, prefix string) string {
	t.Helper()
	timeout := time.After(120 * time.Second) // a hang guard only
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-p.done:
			for {
				select {
				case l := <-p.lines:
					if strings.HasPrefix(l, prefix) {
						return l
					}
				default:
					t.Fatalf("child exited before printing %q", prefix)
				}
			}
		case <-timeout:
			t.Fatalf("child printed no %q line", prefix)
		}
	}
}

// kill SIGKILLs the process: no deferred code, no rollback, no sent mark.
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

// unsent returns the outbox's unsent messages.
func unsent(t testing.TB, db *sql.DB, table string) int {
	var n int
	if err := db.QueryRowContext(context.Background(), `SELECT count(*) FROM `+table+` WHERE sent_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
