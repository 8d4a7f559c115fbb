package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Message is one message to publish.
type Message struct {
	// ID identifies the message: required, at most 255 bytes, unique in
	// the outbox table (a second Enqueue of one ID fails, rolling back its
	// transaction). Publishers send it as the broker's deduplication id
	// (Nats-Msg-Id, the AMQP message-id) and idem's consumer helpers use it
	// as the idempotency key, so derive it from what makes the event
	// unique, e.g. "payment.created:" + paymentID.
	ID string
	// Key is the ordering key, e.g. the aggregate id: at most 255 bytes.
	// Messages of one key are published in the order of their rows'
	// sequence numbers, the enqueue order when the key's writers do not
	// overlap (two transactions enqueuing for one key at once may be
	// relayed in either order: serialise them on the aggregate's row).
	// Optional: messages without a key are spread over partitions by ID
	// and have no order.
	Key string
	// Subject is where to publish: the NATS subject, the AMQP routing key,
	// or the Kafka topic. Required, at most 255 bytes.
	Subject string
	// Headers are sent with the message (NATS headers, AMQP headers
	// table, Kafka record headers). Optional; [WithHeaders] adds some at enqueue.
	Headers map[string]string
	// Payload is the message body.
	Payload []byte
	// Enqueued is when the message was enqueued, by the database's clock;
	// set by the relay, ignored by Enqueue.
	Enqueued time.Time
}

// Limits of a [Message]'s text fields, in bytes.
const maxField = 255

// Dialect is the SQL database an [Outbox] lives in.
type Dialect int

// Dialects.
const (
	// PostgreSQL 12 or later (pgx through database/sql for the relay).
	PostgreSQL Dialect = iota + 1
	// MySQL 8.0 or later, MariaDB 10.6 or later (FOR UPDATE SKIP LOCKED).
	MySQL
)

// String returns "postgresql" or "mysql".
func (d Dialect) String() string {
	switch d {
	case PostgreSQL:
		return "postgresql"
	case MySQL:
		return "mysql"
	}
	return "dialect(" + strconv.Itoa(int(d)) + ")"
}

// Defaults.
const (
	DefaultTable      = "idem_outbox"
	DefaultPartitions = 16
)

// Errors.
var (
	// ErrInvalidMessage is returned (wrapped, with the reason) by Enqueue
	// for a message without an ID or a subject, or with a field too long.
	ErrInvalidMessage = errors.New("outbox: invalid message")
	// ErrInvalidConfig is returned (wrapped) by [New] and [NewRelay] for a
	// bad dialect, table name or option value.
	ErrInvalidConfig = errors.New("outbox: invalid configuration")
)

// Outbox is one outbox table: [Outbox.Enqueue] writes to it, a [Relay]
// reads it. It is safe for concurrent use and does no I/O until called.
type Outbox struct {
	d          Dialect
	table      string // quoted, schema-qualified when name is
	parts      string // quoted partitions table
	name       string // as given to WithTable
	base       string // name without its schema, for index names
	partitions int
	headers    func(context.Context, map[string]string)
	q          queries
}

// queries are the relay's statements, built once by New from the
// validated table names.
type queries struct {
	claim, claimed, read, markSent, purge, pending string
	// lock (MySQL) locks one partition of the claim's candidates, by
	// primary key, if it still has work and no one holds it.
	lock string
}

func (o *Outbox) buildQueries() {
	now, age, oldest := "clock_timestamp()", `(extract(epoch from (clock_timestamp() - created_at)) * 1000000)::bigint`,
		`coalesce((extract(epoch from (clock_timestamp() - min(created_at))) * 1000000)::bigint, 0)`
	o.q.purge = `DELETE FROM ` + o.table + ` WHERE id IN (SELECT id FROM ` + o.table + ` WHERE sent_at < clock_timestamp() - $1 * interval '1 microsecond' LIMIT $2)`
	if o.d == MySQL {
		now, age, oldest = "NOW(6)", `TIMESTAMPDIFF(MICROSECOND, created_at, NOW(6))`, `coalesce(TIMESTAMPDIFF(MICROSECOND, min(created_at), NOW(6)), 0)`
		o.q.purge = `DELETE FROM ` + o.table + ` WHERE sent_at < NOW(6) - INTERVAL ? MICROSECOND LIMIT ?`
	}
	hasWork := `EXISTS (SELECT 1 FROM ` + o.table + ` m WHERE m.part = p.part AND m.sent_at IS NULL)`
	o.q.claim = `SELECT p.part FROM ` + o.parts + ` p WHERE ` + hasWork + ` ORDER BY p.claimed_at, p.part LIMIT 1 FOR UPDATE SKIP LOCKED`
	if o.d == MySQL {
		// InnoDB locks every row a locking read scans, and this ORDER BY
		// scans them all (a filesort): one statement would lock every
		// partition. The claim reads the candidates without locking, and
		// lock takes one of them by primary key, locking that row only.
		o.q.claim = `SELECT p.part FROM ` + o.parts + ` p WHERE ` + hasWork + ` ORDER BY p.claimed_at, p.part`
		o.q.lock = `SELECT p.part FROM ` + o.parts + ` p WHERE p.part = ? AND ` + hasWork + ` FOR UPDATE SKIP LOCKED`
	}
	o.q.claimed = `UPDATE ` + o.parts + ` SET claimed_at = ` + now + ` WHERE part = ` + o.ph(1)
	o.q.read = `SELECT id, msg_id, ordering_key, subject, headers, payload, created_at, ` + age + ` FROM ` + o.table + `
		WHERE part = ` + o.ph(1) + ` AND sent_at IS NULL ORDER BY id LIMIT ` + o.ph(2)
	o.q.markSent = `UPDATE ` + o.table + ` SET sent_at = ` + now + ` WHERE id IN (`
	o.q.pending = `SELECT count(*), ` + oldest + ` FROM ` + o.table + ` WHERE sent_at IS NULL`
}

// Option configures [New].
type Option func(*Outbox)

// WithTable sets the outbox table's name, "table" or "schema.table" (a
// MySQL database for the schema), each part letters, digits and
// underscores starting with a letter or an underscore, the table at most
// 50 characters and the schema at most 63; the partitions table is the
// same name plus "_partitions", in the same schema. Optional. Default is
// "idem_outbox", in the connection's search_path (PostgreSQL) or database
// (MySQL).
func WithTable(name string) Option { return func(o *Outbox) { o.name = name } }

// WithPartitions sets how many partitions messages are spread over by
// their ordering key: the most relay workers that can publish at once.
// Every writer and relay of a table must use the same number, fixed when
// messages exist (changing it moves keys between partitions: the messages
// pending at the change may then be published out of order). Optional.
// Default is 16; at most 1024.
func WithPartitions(n int) Option { return func(o *Outbox) { o.partitions = n } }

// WithHeaders sets a function called by every Enqueue with the handler's
// context and the message's headers (a fresh map, the message's own
// headers copied in), to add some: idemotel.InjectTraceContext puts the
// W3C trace context there, so the consumer's span continues the handler's
// trace. Optional. Default adds none.
func WithHeaders(fn func(ctx context.Context, headers map[string]string)) Option {
	return func(o *Outbox) { o.headers = fn }
}

// identifier is a table name of WithTable, schemaName its schema: 50 for
// the table leaves room for the "_partitions" suffix within PostgreSQL's
// 63-byte identifiers (MySQL's are 64).
var (
	identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,49}$`)
	schemaName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)
)

// New returns the outbox table of dialect d.
//
// Errors: [ErrInvalidConfig] for an unknown dialect, a bad table name or
// partition count.
func New(d Dialect, opts ...Option) (*Outbox, error) {
	o := &Outbox{d: d, name: DefaultTable, partitions: DefaultPartitions}
	for _, opt := range opts {
		opt(o)
	}
	if d != PostgreSQL && d != MySQL {
		return nil, fmt.Errorf("%w: unknown dialect %d", ErrInvalidConfig, int(d))
	}
	schema, table, qualified := strings.Cut(o.name, ".")
	if !qualified {
		schema, table = "", o.name
	}
	if !identifier.MatchString(table) || qualified && !schemaName.MatchString(schema) {
		return nil, fmt.Errorf("%w: table name %q (table or schema.table; letters, digits, underscores; the table at most 50, the schema at most 63)", ErrInvalidConfig, o.name)
	}
	if o.partitions < 1 || o.partitions > 1024 {
		return nil, fmt.Errorf("%w: %d partitions (1 to 1024)", ErrInvalidConfig, o.partitions)
	}
	o.base = table
	o.table, o.parts = o.quote(table), o.quote(table+"_partitions")
	if qualified {
		o.table, o.parts = o.quote(schema)+"."+o.table, o.quote(schema)+"."+o.parts
	}
	o.buildQueries()
	return o, nil
}

func (o *Outbox) quote(name string) string {
	if o.d == MySQL {
		return "`" + name + "`"
	}
	return `"` + name + `"`
}

// Table returns the outbox table's name as given to [WithTable]
// ("schema.table" or "table"), unquoted.
func (o *Outbox) Table() string { return o.name }

// ph returns the n-th (1-based) placeholder.
func (o *Outbox) ph(n int) string {
	if o.d == MySQL {
		return "?"
	}
	return "$" + strconv.Itoa(n)
}

// Execer is what Enqueue writes through: a transaction of database/sql
// (*sql.Tx, which mysqlstore.Tx returns), or any statement executor
// whose writes must commit with the messages. Wrap a pgx.Tx (pgstore.Tx
// returns one) with [Pgx].
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// PgxExecer is the method of a pgx.Tx that [Pgx] needs; R is
// pgconn.CommandTag, inferred, so that this package does not import pgx.
type PgxExecer[R any] interface {
	Exec(ctx context.Context, sql string, args ...any) (R, error)
}

// Pgx returns an [Execer] writing through tx, a pgx.Tx (pgstore.Tx, or the
// caller's own) or a pgx connection or pool: outbox.Pgx(tx).
func Pgx[R any](tx PgxExecer[R]) Execer { return pgxExecer[R]{tx} }

type pgxExecer[R any] struct{ tx PgxExecer[R] }

func (p pgxExecer[R]) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	_, err := p.tx.Exec(ctx, query, args...)
	return nil, err
}

// Enqueue writes msgs into the outbox table through tx, in one INSERT, in
// the given order: they are published once tx commits, never if it rolls
// back. Call it inside the handler's transaction (pgstore.Tx,
// mysqlstore.Tx, or your own), after the business writes.
//
// Errors: [ErrInvalidMessage] (nothing written), the INSERT's error
// (e.g. a duplicate ID), wrapped.
func (o *Outbox) Enqueue(ctx context.Context, tx Execer, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + o.table + " (msg_id, ordering_key, part, subject, headers, payload) VALUES ")
	args := make([]any, 0, 6*len(msgs))
	for i, m := range msgs {
		if err := m.validate(); err != nil {
			return err
		}
		headers, err := o.encodeHeaders(ctx, m.Headers)
		if err != nil {
			return err
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(")
		for j := range 6 {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString(o.ph(len(args) + j + 1))
		}
		b.WriteString(")")
		args = append(args, m.ID, m.Key, o.partition(m), m.Subject, headers, payload)
	}
	if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
		return fmt.Errorf("outbox: enqueue %d message(s): %w", len(msgs), err)
	}
	return nil
}

func (m Message) validate() error {
	switch {
	case m.ID == "":
		return fmt.Errorf("%w: no ID", ErrInvalidMessage)
	case m.Subject == "":
		return fmt.Errorf("%w %q: no subject", ErrInvalidMessage, m.ID)
	case len(m.ID) > maxField, len(m.Key) > maxField, len(m.Subject) > maxField:
		return fmt.Errorf("%w %.40q: ID, key and subject are limited to %d bytes", ErrInvalidMessage, m.ID, maxField)
	}
	return nil
}

// encodeHeaders returns the headers as stored: JSON, "" for none.
func (o *Outbox) encodeHeaders(ctx context.Context, h map[string]string) (string, error) {
	if o.headers != nil {
		c := make(map[string]string, len(h)+2)
		for k, v := range h {
			c[k] = v
		}
		o.headers(ctx, c)
		h = c
	}
	if len(h) == 0 {
		return "", nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", fmt.Errorf("%w: headers: %w", ErrInvalidMessage, err)
	}
	return string(b), nil
}

// partition returns the message's partition: FNV-1a of its ordering key,
// or of its ID when it has none.
func (o *Outbox) partition(m Message) int {
	h := fnv.New32a()
	if m.Key != "" {
		_, _ = h.Write([]byte(m.Key))
	} else {
		_, _ = h.Write([]byte(m.ID))
	}
	return int(h.Sum32() % uint32(o.partitions))
}

// EnsureSchema creates the outbox table, its indexes and its partitions
// table if they do not exist, and the partitions' rows; safe to call from
// every process at start-up.
func (o *Outbox) EnsureSchema(ctx context.Context, db *sql.DB) error {
	var stmts []string
	if o.d == PostgreSQL {
		stmts = []string{
			`CREATE TABLE IF NOT EXISTS ` + o.table + ` (
				id bigserial PRIMARY KEY,
				msg_id text NOT NULL UNIQUE,
				ordering_key text NOT NULL DEFAULT '',
				part integer NOT NULL,
				subject text NOT NULL,
				headers text NOT NULL DEFAULT '',
				payload bytea NOT NULL,
				created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
				sent_at timestamptz NULL)`,
			`CREATE INDEX IF NOT EXISTS ` + o.quote(o.base+"_unsent") + ` ON ` + o.table + ` (part, id) WHERE sent_at IS NULL`,
			`CREATE INDEX IF NOT EXISTS ` + o.quote(o.base+"_sent") + ` ON ` + o.table + ` (sent_at) WHERE sent_at IS NOT NULL`,
			`CREATE TABLE IF NOT EXISTS ` + o.parts + ` (part integer PRIMARY KEY, claimed_at timestamptz NOT NULL DEFAULT '-infinity')`,
			`INSERT INTO ` + o.parts + ` (part) SELECT generate_series(0, ` + strconv.Itoa(o.partitions-1) + `) ON CONFLICT DO NOTHING`,
		}
	} else {
		stmts = []string{
			"CREATE TABLE IF NOT EXISTS " + o.table + ` (
				id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
				msg_id VARCHAR(255) NOT NULL,
				ordering_key VARCHAR(255) NOT NULL DEFAULT '',
				part INT NOT NULL,
				subject VARCHAR(255) NOT NULL,
				headers TEXT NOT NULL,
				payload LONGBLOB NOT NULL,
				created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
				sent_at DATETIME(6) NULL,
				UNIQUE KEY msg_id (msg_id),
				KEY unsent (part, sent_at, id),
				KEY sent (sent_at)
			) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
			"CREATE TABLE IF NOT EXISTS " + o.parts + " (part INT NOT NULL PRIMARY KEY, claimed_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:01') ENGINE=InnoDB",
		}
		var v strings.Builder
		for i := range o.partitions {
			if i > 0 {
				v.WriteString(", ")
			}
			v.WriteString("(" + strconv.Itoa(i) + ")")
		}
		stmts = append(stmts, "INSERT IGNORE INTO "+o.parts+" (part) VALUES "+v.String())
	}
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("outbox: create the schema of %s: %w", o.name, err)
		}
	}
	return nil
}
