package outbox

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

	"github.com/cenkalti/backoff/v5"
)

// Publisher publishes one message to a broker and returns once the broker
// confirmed it (a JetStream PubAck, a RabbitMQ publisher confirm): nil
// means the message is stored by the broker. It must send m.ID as the
// broker's message id. The relay calls Publish from one goroutine per
// worker, in order within a partition; implementations live with the
// broker clients (idemnats.NewPublisher, idemamqp.NewPublisher).
type Publisher interface {
	Publish(ctx context.Context, m Message) error
}

// BatchPublisher is a [Publisher] that can pipeline: the relay uses it
// when its publisher has it. PublishBatch publishes msgs, whose ordering
// keys are distinct (or empty), without waiting for one confirmation
// before sending the next, and returns one error per message, in msgs'
// order (nil: confirmed). The relay sends a claimed batch in waves: the
// first unsent message of each key, then the next of each, and so on, so
// a key's message is sent only once its predecessor is confirmed, and
// stops after a wave with a failure.
type BatchPublisher interface {
	Publisher
	PublishBatch(ctx context.Context, msgs []Message) []error
}

// Observer receives the relay's measurements; idemotel.NewOutboxMetrics
// records them as OpenTelemetry metrics. Its methods must be safe for
// concurrent use and must not block.
type Observer interface {
	// Published is called after the broker confirmed m; lag is the time
	// from its enqueue (the transaction's clock) to the confirmation.
	Published(ctx context.Context, m Message, lag time.Duration)
	// PublishFailed is called when publishing m failed; the relay backs
	// off and publishes it again.
	PublishFailed(ctx context.Context, m Message, err error)
	// Pending reports the unsent (committed) messages and the age of the
	// oldest one, every [WithPendingInterval].
	Pending(ctx context.Context, messages int64, oldest time.Duration)
}

// Relay defaults.
const (
	DefaultBatchSize       = 100
	DefaultPollInterval    = 200 * time.Millisecond
	DefaultPublishTimeout  = 10 * time.Second
	DefaultRetention       = 24 * time.Hour
	DefaultPurgeInterval   = time.Minute
	DefaultPendingInterval = 10 * time.Second
	DefaultMaxBackoff      = 30 * time.Second
)

// Relay publishes an [Outbox]'s committed messages and marks them sent.
// Run any number of them, in any number of processes (see the package
// documentation).
type Relay struct {
	db  *sql.DB
	o   *Outbox
	pub Publisher

	batch, workers                 int
	poll, timeout                  time.Duration
	retention, purgeEvery, pending time.Duration
	minBackoff, maxBackoff         time.Duration
	observer                       Observer
	logger                         *slog.Logger
}

// RelayOption configures [NewRelay].
type RelayOption func(*Relay)

// WithBatchSize sets how many messages a worker claims at most per
// transaction: it publishes them one by one and marks them sent together.
// Optional. Default is 100.
func WithBatchSize(n int) RelayOption { return func(r *Relay) { r.batch = n } }

// WithWorkers sets how many partitions this relay publishes at once, each
// in its own transaction (one database connection each). Optional.
// Default is 1.
func WithWorkers(n int) RelayOption { return func(r *Relay) { r.workers = n } }

// WithPollInterval sets how long a worker waits after finding nothing to
// publish. Optional. Default is 200ms.
func WithPollInterval(d time.Duration) RelayOption { return func(r *Relay) { r.poll = d } }

// WithPublishTimeout bounds one Publish call. Optional. Default is 10s.
func WithPublishTimeout(d time.Duration) RelayOption { return func(r *Relay) { r.timeout = d } }

// WithRetention sets how long sent messages are kept before the purge
// deletes them, in batches, every [WithPurgeInterval]. Optional. Default is 24h.
func WithRetention(d time.Duration) RelayOption { return func(r *Relay) { r.retention = d } }

// WithPurgeInterval sets how often the relay deletes messages sent more
// than the retention ago; 0 disables the purge. Optional. Default is 1m.
func WithPurgeInterval(d time.Duration) RelayOption { return func(r *Relay) { r.purgeEvery = d } }

// WithPendingInterval sets how often the relay counts unsent messages for
// [Observer.Pending]. Optional. Default is 10s; ignored without an observer.
func WithPendingInterval(d time.Duration) RelayOption { return func(r *Relay) { r.pending = d } }

// WithBackoff sets the bounds of the exponential backoff (factor 2,
// jitter ±50%) a worker waits after a failed publish or database error,
// reset by a success. Optional. Default is 100ms to 30s.
func WithBackoff(initial, maxDelay time.Duration) RelayOption {
	return func(r *Relay) { r.minBackoff, r.maxBackoff = initial, maxDelay }
}

// WithObserver sets where measurements go. Optional. Default is none.
func WithObserver(o Observer) RelayOption { return func(r *Relay) { r.observer = o } }

// WithLogger sets where failures are logged. Optional. Default is slog.Default().
func WithLogger(l *slog.Logger) RelayOption { return func(r *Relay) { r.logger = l } }

// NewRelay returns a relay publishing o's messages, read from db (the
// database o lives in; for PostgreSQL with pgx, stdlib.OpenDBFromPool),
// through p. It does no I/O.
//
// Errors: [ErrInvalidConfig] for a nil argument or a non-positive size or
// duration.
func NewRelay(db *sql.DB, o *Outbox, p Publisher, opts ...RelayOption) (*Relay, error) {
	r := &Relay{
		db: db, o: o, pub: p,
		batch: DefaultBatchSize, workers: 1, poll: DefaultPollInterval, timeout: DefaultPublishTimeout,
		retention: DefaultRetention, purgeEvery: DefaultPurgeInterval, pending: DefaultPendingInterval,
		minBackoff: 100 * time.Millisecond, maxBackoff: DefaultMaxBackoff,
		logger: slog.Default(),
	}
	for _, opt := range opts {
		opt(r)
	}
	switch {
	case db == nil || o == nil || p == nil:
		return nil, fmt.Errorf("%w: NewRelay needs a database, an outbox and a publisher", ErrInvalidConfig)
	case r.batch < 1 || r.batch > 10000 || r.workers < 1:
		return nil, fmt.Errorf("%w: batch size %d (1 to 10000), %d workers", ErrInvalidConfig, r.batch, r.workers)
	case r.poll <= 0 || r.timeout <= 0 || r.retention <= 0 || r.purgeEvery < 0 || r.pending <= 0 ||
		r.minBackoff <= 0 || r.maxBackoff < r.minBackoff:
		return nil, fmt.Errorf("%w: durations must be positive (and the backoff's maximum not below its initial delay)", ErrInvalidConfig)
	}
	return r, nil
}

// Run publishes until ctx is done, then returns nil once its workers
// stopped (a publish in flight is abandoned: its transaction rolls back
// and the message is published again by the next claim). Database and
// broker failures are logged and retried with backoff, never returned.
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range r.workers {
		wg.Add(1)
		go func() { defer wg.Done(); r.work(ctx) }()
	}
	if r.purgeEvery > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); r.every(ctx, r.purgeEvery, r.purgeLogged) }()
	}
	if r.observer != nil {
		wg.Add(1)
		go func() { defer wg.Done(); r.every(ctx, r.pending, r.observePending) }()
	}
	wg.Wait()
	return nil
}

func (r *Relay) work(ctx context.Context) {
	bo := &backoff.ExponentialBackOff{
		InitialInterval: r.minBackoff, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: r.maxBackoff,
	}
	bo.Reset()
	for ctx.Err() == nil {
		n, err := r.RelayOnce(ctx)
		var wait time.Duration
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			wait = bo.NextBackOff()
			r.logger.WarnContext(ctx, "outbox: relay failed; backing off", "table", r.o.name, "published", n, "delay", wait, "err", err)
		case n == 0:
			bo.Reset()
			wait = r.poll
		default:
			bo.Reset()
			continue
		}
		sleep(ctx, wait)
	}
}

func (r *Relay) every(ctx context.Context, d time.Duration, fn func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// RelayOnce claims one partition with unsent messages, publishes up to the
// batch size of them in order and marks the published ones sent, in one
// transaction; it returns how many it published (0: no partition has
// work, or every one is claimed). On a failed publish it marks the ones
// confirmed sent and returns the error with their count. [Relay.Run]
// calls it in a loop; call it yourself to relay from your own loop.
func (r *Relay) RelayOnce(ctx context.Context) (published int, err error) {
	tx, err := r.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("outbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // after Commit: sql.ErrTxDone, ignored
	o := r.o
	part, err := r.claim(ctx, tx)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: claim a partition: %w", err)
	}
	if _, err := tx.ExecContext(ctx, o.q.claimed, part); err != nil {
		return 0, fmt.Errorf("outbox: claim partition %d: %w", part, err)
	}
	msgs, ids, ages, err := r.read(ctx, tx, part)
	if err != nil {
		return 0, err
	}
	read := time.Now()
	var (
		sent []int64
		perr error
	)
	if bp, ok := r.pub.(BatchPublisher); ok {
		sent, perr = r.publishWaves(ctx, bp, msgs, ids, ages, read)
	} else {
		sent, perr = r.publishEach(ctx, msgs, ids, ages, read)
	}
	published = len(sent)
	if published > 0 {
		if err := r.markSent(ctx, tx, sent); err != nil {
			return 0, errors.Join(perr, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, errors.Join(perr, fmt.Errorf("outbox: commit the sent marks: %w", err))
	}
	return published, perr
}

// claim locks the partition with unsent messages claimed least recently
// that no one holds, in tx; sql.ErrNoRows when there is none. On
// PostgreSQL one statement does it (FOR UPDATE SKIP LOCKED locks the row
// it returns). On MySQL and MariaDB it reads the candidates without
// locking, in claim order, and locks the first one free by primary key:
// a locking read there locks every row it scans, so the ordered claim in
// one statement would hold all partitions and leave the other workers
// none.
func (r *Relay) claim(ctx context.Context, tx *sql.Tx) (int, error) {
	o := r.o
	var part int
	if o.d != MySQL {
		err := tx.QueryRowContext(ctx, o.q.claim).Scan(&part)
		return part, err
	}
	rows, err := tx.QueryContext(ctx, o.q.claim)
	if err != nil {
		return 0, err
	}
	var candidates []int
	for rows.Next() {
		if err := rows.Scan(&part); err != nil {
			_ = rows.Close()
			return 0, err
		}
		candidates = append(candidates, part)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for _, c := range candidates {
		err := tx.QueryRowContext(ctx, o.q.lock, c).Scan(&part)
		if !errors.Is(err, sql.ErrNoRows) {
			return part, err
		}
	}
	return 0, sql.ErrNoRows
}

// publishEach publishes msgs one by one, each after the previous one's
// confirmation, until one fails; it returns the ids of those confirmed.
func (r *Relay) publishEach(ctx context.Context, msgs []Message, ids []int64, ages []time.Duration, read time.Time) ([]int64, error) {
	for i, m := range msgs {
		pctx, cancel := context.WithTimeout(ctx, r.timeout)
		err := r.pub.Publish(pctx, m)
		cancel()
		if err != nil {
			r.failed(ctx, m, err)
			return ids[:i], fmt.Errorf("outbox: publish %q: %w", m.ID, err)
		}
		r.published(ctx, m, ages[i]+time.Since(read))
	}
	return ids, nil
}

// publishWaves publishes msgs through bp in waves of distinct keys (see
// [BatchPublisher]) until a wave has a failure; it returns the ids of the
// messages confirmed.
func (r *Relay) publishWaves(ctx context.Context, bp BatchPublisher, msgs []Message, ids []int64, ages []time.Duration, read time.Time) ([]int64, error) {
	var sent []int64
	remaining := make([]int, len(msgs))
	for i := range remaining {
		remaining[i] = i
	}
	for len(remaining) > 0 {
		var wave, rest []int
		keys := make(map[string]bool)
		for _, i := range remaining {
			if k := msgs[i].Key; k != "" {
				if keys[k] {
					rest = append(rest, i)
					continue
				}
				keys[k] = true
			}
			wave = append(wave, i)
		}
		batch := make([]Message, len(wave))
		for j, i := range wave {
			batch[j] = msgs[i]
		}
		pctx, cancel := context.WithTimeout(ctx, r.timeout)
		errs := bp.PublishBatch(pctx, batch)
		cancel()
		var first error
		for j, i := range wave {
			var err error
			if j < len(errs) {
				err = errs[j]
			} else {
				err = errors.New("no result from PublishBatch")
			}
			if err != nil {
				r.failed(ctx, msgs[i], err)
				if first == nil {
					first = fmt.Errorf("outbox: publish %q: %w", msgs[i].ID, err)
				}
				continue
			}
			sent = append(sent, ids[i])
			r.published(ctx, msgs[i], ages[i]+time.Since(read))
		}
		if first != nil {
			return sent, first
		}
		remaining = rest
	}
	return sent, nil
}

func (r *Relay) published(ctx context.Context, m Message, lag time.Duration) {
	if r.observer != nil {
		r.observer.Published(ctx, m, lag)
	}
}

func (r *Relay) failed(ctx context.Context, m Message, err error) {
	if r.observer != nil {
		r.observer.PublishFailed(ctx, m, err)
	}
}

// read returns the partition's oldest unsent messages, their row ids and
// their ages.
func (r *Relay) read(ctx context.Context, tx *sql.Tx, part int) ([]Message, []int64, []time.Duration, error) {
	rows, err := tx.QueryContext(ctx, r.o.q.read, part, r.batch)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("outbox: read partition %d: %w", part, err)
	}
	defer rows.Close()
	var (
		msgs []Message
		ids  []int64
		ages []time.Duration
	)
	for rows.Next() {
		var (
			m       Message
			id, us  int64
			headers string
		)
		if err := rows.Scan(&id, &m.ID, &m.Key, &m.Subject, &headers, &m.Payload, (*enqueuedAt)(&m.Enqueued), &us); err != nil {
			return nil, nil, nil, fmt.Errorf("outbox: read partition %d: %w", part, err)
		}
		if headers != "" {
			if err := json.Unmarshal([]byte(headers), &m.Headers); err != nil {
				return nil, nil, nil, fmt.Errorf("outbox: message %q: headers: %w", m.ID, err)
			}
		}
		msgs, ids, ages = append(msgs, m), append(ids, id), append(ages, time.Duration(us)*time.Microsecond)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, fmt.Errorf("outbox: read partition %d: %w", part, err)
	}
	return msgs, ids, ages, nil
}

func (r *Relay) markSent(ctx context.Context, tx *sql.Tx, ids []int64) error {
	var b strings.Builder
	b.WriteString(r.o.q.markSent)
	args := make([]any, len(ids))
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(r.o.ph(i + 1))
		args[i] = id
	}
	b.WriteString(")")
	_, err := tx.ExecContext(ctx, b.String(), args...)
	if err != nil {
		return fmt.Errorf("outbox: mark %d message(s) sent: %w", len(ids), err)
	}
	return nil
}

// purgeBatch bounds one DELETE of the purge.
const purgeBatch = 1000

// Purge deletes the messages sent more than the retention ago, in
// batches of 1,000, and returns how many it deleted. [Relay.Run] calls it
// every [WithPurgeInterval].
func (r *Relay) Purge(ctx context.Context) (int64, error) {
	var total int64
	for {
		res, err := r.db.ExecContext(ctx, r.o.q.purge, r.retention.Microseconds(), purgeBatch)
		if err != nil {
			return total, fmt.Errorf("outbox: purge: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("outbox: purge: %w", err)
		}
		total += n
		if n < purgeBatch {
			return total, nil
		}
	}
}

func (r *Relay) purgeLogged(ctx context.Context) {
	if _, err := r.Purge(ctx); err != nil && ctx.Err() == nil {
		r.logger.WarnContext(ctx, "outbox: purge failed", "table", r.o.name, "err", err)
	}
}

// Pending returns the number of unsent messages and the age of the oldest
// one (0 when none), by the database's clock.
func (r *Relay) Pending(ctx context.Context) (messages int64, oldest time.Duration, err error) {
	var us int64
	err = r.db.QueryRowContext(ctx, r.o.q.pending).Scan(&messages, &us)
	if err != nil {
		return 0, 0, fmt.Errorf("outbox: count pending: %w", err)
	}
	return messages, time.Duration(us) * time.Microsecond, nil
}

func (r *Relay) observePending(ctx context.Context) {
	n, oldest, err := r.Pending(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.logger.WarnContext(ctx, "outbox: counting pending messages failed", "table", r.o.name, "err", err)
		}
		return
	}
	r.observer.Pending(ctx, n, oldest)
}

// enqueuedAt scans created_at: a time.Time (PostgreSQL; MySQL with the
// driver's parseTime), or the text of a MySQL DATETIME(6) without it, read
// as UTC, so that the relay works on any go-sql-driver DSN.
type enqueuedAt time.Time

// Scan implements sql.Scanner.
func (e *enqueuedAt) Scan(src any) error {
	switch v := src.(type) {
	case time.Time:
		*e = enqueuedAt(v)
		return nil
	case []byte:
		return e.parse(string(v))
	case string:
		return e.parse(v)
	}
	return fmt.Errorf("outbox: created_at of type %T", src)
}

func (e *enqueuedAt) parse(s string) error {
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s, time.UTC)
	if err != nil {
		return fmt.Errorf("outbox: created_at: %w", err)
	}
	*e = enqueuedAt(t)
	return nil
}
