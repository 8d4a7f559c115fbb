package outboxtest

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/outbox"
)

// chaosWorld is one chaos run: a JetStream server of its own, an outbox,
// a payments table (the handlers' business rows) and the consumer.
type chaosWorld struct {
	t       *testing.T
	nodes   []*natsNode
	js      jetstream.JetStream
	stream  jetstream.Stream
	cons    jetstream.Consumer
	db      *sql.DB
	ob      *outbox.Outbox
	pay     string
	fx      *effects
	logs    *os.File
	env     []string
	subject string
}

func newChaosWorld(t *testing.T) *chaosWorld {
	w := &chaosWorld{t: t, nodes: startNATS(t, 1)}
	_, w.js = connect(t, urls(w.nodes))
	name := strings.ToUpper(uniq("s"))
	w.subject = name + ".payment.created"
	w.stream = createStream(t, w.js, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage})
	db, pgPool := openDB(t, outbox.PostgreSQL)
	w.db = db
	w.ob = newOutbox(t, db, outbox.PostgreSQL)
	w.pay = uniq("pay")
	if _, err := db.ExecContext(ctxT(t, 10*time.Second), `CREATE TABLE `+w.pay+` (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropTables(db, w.pay) })
	w.fx = newEffects(t, pgPool)
	w.cons = consumeNATS(t, w.stream, w.fx.natsHandler())
	w.logs = childLogs(t)
	w.env = []string{"OB_PG=" + pgURL(), "OB_TABLE=" + w.ob.Table(), "OB_PAY=" + w.pay, "OB_PREFIX=" + strings.ToLower(name),
		"OB_SUBJECT=" + w.subject, "OB_NATS=" + urls(w.nodes), "OB_ROLLBACK_EVERY=5"}
	return w
}

func (w *chaosWorld) start(role string, env ...string) *proc {
	p := startChild(w.t, w.logs, role, append(append([]string{}, w.env...), env...)...)
	p.waitLine(w.t, "ready")
	return p
}

// handlers plays payments [from, to), killing a handler at each
// (point, payment) of kills, in order.
func (w *chaosWorld) handlers(from, to int, mode string, kills ...struct {
	point string
	at    int
}) {
	for _, k := range kills {
		h := w.start("handler", "OB_MODE="+mode, "OB_FROM="+strconv.Itoa(from), "OB_TO="+strconv.Itoa(to), "OB_PAUSE="+k.point, "OB_PAUSE_AT="+strconv.Itoa(k.at))
		h.waitLine(w.t, "pausing")
		h.kill()
		from = k.at + 1
	}
	h := w.start("handler", "OB_MODE="+mode, "OB_FROM="+strconv.Itoa(from), "OB_TO="+strconv.Itoa(to))
	h.waitLine(w.t, "done")
	h.stop()
}

// committed returns the message ids of the committed payments.
func (w *chaosWorld) committed() []string {
	rows, err := w.db.QueryContext(context.Background(), `SELECT id FROM `+w.pay)
	if err != nil {
		w.t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			w.t.Fatal(err)
		}
		ids = append(ids, "payment.created:"+id)
	}
	return ids
}

// drained waits until the consumer acked everything in the stream.
func (w *chaosWorld) drained() {
	waitFor(w.t, "every message acked", 120*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		info, err := w.cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

func (w *chaosWorld) storedMessages() uint64 {
	info, err := w.stream.Info(ctxT(w.t, 10*time.Second))
	if err != nil {
		w.t.Fatal(err)
	}
	return info.State.Msgs
}

type kill = struct {
	point string
	at    int
}

// TestChaosOutbox SIGKILLs handler processes before and after their
// commit and relay processes before a publish, after a publish before its
// PubAck, and between the PubAck and the sent mark; kills the broker while
// two relays run and restarts it. Every committed payment must yield
// exactly one effect at the consumer, no rolled-back (every 5th) or
// killed-before-commit one any, and the stream must hold each message once
// (its duplicate window dropped the relays' re-publishes).
func TestChaosOutbox(t *testing.T) {
	n := 60
	if *soak {
		n = 600
	}
	rng := rand.New(rand.NewPCG(uint64(*seed), 35))
	w := newChaosWorld(t)
	k1 := 1 + rng.IntN(n/3)
	k2 := n/3 + rng.IntN(n/3)
	if k2%5 == 4 { // a rolled-back payment never reaches after-commit
		k2++
	}
	w.handlers(0, n, "outbox", kill{"before-commit", k1}, kill{"after-commit", k2})
	want := w.committed()
	if len(want) == 0 || len(want) >= n {
		t.Fatalf("%d committed payments of %d: the handlers' rollbacks and kills did not happen", len(want), n)
	}
	for _, point := range []string{"before-publish", "after-publish", "after-confirm"} {
		r := w.start("relay", "OB_PAUSE="+point, "OB_PAUSE_AT="+strconv.Itoa(2+rng.IntN(8)), "OB_BATCH=5")
		r.waitLine(t, "pausing")
		r.kill()
	}
	// The broker goes down; two relays start against it, back off, and
	// publish the rest once it is back.
	w.nodes[0].kill()
	relays := []*proc{w.start("relay", "OB_BATCH=7", "OB_WORKERS=2"), w.start("relay", "OB_BATCH=3")}
	time.Sleep(500 * time.Millisecond) // the relays fail and back off meanwhile
	w.nodes[0].start()
	waitFor(t, "an empty outbox", 120*time.Second, func() bool { return unsent(t, w.db, w.ob.Table()) == 0 })
	for _, r := range relays {
		r.stop()
	}
	w.drained()
	w.fx.checkExactlyOnce(want)
	if got := w.storedMessages(); got != uint64(len(want)) {
		t.Errorf("the stream holds %d messages for %d committed payments: a re-publish was not dropped", got, len(want))
	}
	t.Logf("%d payments, %d committed; handler killed before commit at %d, after commit at %d; relays killed at 3 points, broker killed and restarted; %d effects",
		n, len(want), k1, k2, len(w.fx.counts()))
}

// TestChaosControl is TestChaosOutbox's handler kill after the commit
// without the outbox: the handler publishes after its commit, and the
// payment committed by the killed one is never published.
func TestChaosControl(t *testing.T) {
	n := 30
	w := newChaosWorld(t)
	k := 12
	w.handlers(0, n, "direct", kill{"after-commit", k})
	want := w.committed()
	w.drained()
	got := w.fx.counts()
	lost := "payment.created:" + w.env[3][len("OB_PREFIX="):] + "_00012"
	if len(got) != len(want)-1 || got[lost] != 0 {
		t.Fatalf("publishing after the commit: %d effects for %d committed payments; want the killed handler's %s lost", len(got), len(want), lost)
	}
	t.Logf("without the outbox: %d committed payments, %d effects: %s lost", len(want), len(got), lost)
}
