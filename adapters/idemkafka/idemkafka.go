package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	idem "github.com/idemkit/idem/core"
)

// Func handles one record. ctx carries the execution
// ([idem.InfoFromContext]; pgstore.Tx(ctx) for a transactional store).
// Return nil when done, an error to have the record retried, or an error
// marked with [idem.Permanent] to have it stored and its offset committed.
type Func func(ctx context.Context, r *kgo.Record) error

// KeyHeader is the record header the idempotency key is read from by
// default, the header [Publisher] writes the outbox message's ID to: the
// name of idem's HTTP header ([idem.DefaultHeader]).
const KeyHeader = idem.DefaultHeader

// Headers [Consumer] adds to a record it parks in the dead-letter topic,
// beside the record's own headers, key and value.
const (
	HeaderOutcome   = "Idem-Outcome"    // the outcome's name ([idem.Outcome.String])
	HeaderRecordKey = "Idem-Record-Key" // the record's key in the store, for idemctl ([idem.Operation.RecordKey])
	HeaderError     = "Idem-Error"      // the error's text
	HeaderOrigin    = "Idem-Origin"     // topic/partition/offset of the parked record
)

// Defaults of [Consumer]'s options.
const (
	DefaultRetryDelay       = time.Second
	DefaultInProgressLimit  = 2 * time.Minute
	DefaultDeadLetterSuffix = ".DLT"
)

// Option configures [NewConsumer].
type Option func(*config)

type config struct {
	key        func(*kgo.Record) string
	scope      func(*kgo.Record) string
	payload    func(*kgo.Record) []byte
	deadLetter func(*kgo.Record) string
	delay      time.Duration
	inProgress time.Duration
	logger     *slog.Logger
}

// WithKey sets the function taking the idempotency key from a record; ""
// means the record has none (it is dead-lettered). Optional. Default is
// [HeaderOrPositionKey]: the Idempotency-Key header, or the record's
// position when it has none.
func WithKey(fn func(*kgo.Record) string) Option { return func(c *config) { c.key = fn } }

// WithScope sets the function returning a record's scope
// ([idem.Operation.Scope]). Optional. Default is the record's topic.
func WithScope(fn func(*kgo.Record) string) Option { return func(c *config) { c.scope = fn } }

// WithPayload sets the function returning the bytes fingerprinted for a
// record ([idem.Operation.Payload]): a key seen again with another
// payload is dead-lettered as a mismatch. Optional. Default is the
// record's value.
func WithPayload(fn func(*kgo.Record) []byte) Option { return func(c *config) { c.payload = fn } }

// WithDeadLetterTopic sets the function naming the topic a record is
// parked in. Optional. Default is the record's topic plus ".DLT" (Spring
// Kafka's convention). The topic must exist, or the cluster must create
// it on produce: a park that fails is retried in place.
func WithDeadLetterTopic(fn func(*kgo.Record) string) Option {
	return func(c *config) { c.deadLetter = fn }
}

// WithRetryDelay sets the pause before a record that cannot be handled now
// (in progress elsewhere, store unavailable, a transient error of the
// handler, a park that failed) is handled again, in place. Optional.
// Default is 1s.
func WithRetryDelay(d time.Duration) Option { return func(c *config) { c.delay = d } }

// WithInProgressLimit sets how long a record whose key stays in progress
// elsewhere is retried before it is parked in the dead-letter topic, so
// that a key held by a live but stuck execution does not block its
// partition for ever. Keep it above the engine's lease ([idem.WithLease],
// 30s by default): a key whose holder died is taken over once its lease
// lapses. Optional. Default is 2 minutes.
func WithInProgressLimit(d time.Duration) Option { return func(c *config) { c.inProgress = d } }

// WithLogger sets where records that are dead-lettered or retried, and
// partitions lost, are logged. Optional. Default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// HeaderOrPositionKey is the default key function ([WithKey]): the
// record's Idempotency-Key header ([KeyHeader]), else its position
// ([PositionKey]). The header survives a record produced twice (by a
// relay that died between the broker's ack and its sent mark, by a
// producer retrying outside its idempotent session); the position only
// redeliveries of one stored record, the usual duplicates of Kafka (a
// consumer that died before its offset commit, a rebalance). The record
// key is no default: on most topics it is the partitioning key, shared
// by every event of one customer or aggregate (see [RecordKey]).
func HeaderOrPositionKey(r *kgo.Record) string {
	if k := HeaderKey(r); k != "" {
		return k
	}
	return PositionKey(r)
}

// HeaderKey is a key function for [WithKey]: the Idempotency-Key header's
// value, "" without one (the record is then dead-lettered).
func HeaderKey(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == KeyHeader {
			return string(h.Value)
		}
	}
	return ""
}

// PositionKey is a key function for [WithKey]: "<partition>/<offset>" (the
// scope holds the topic), the same for every delivery of one stored record,
// not for a record produced twice, and reused if the topic is deleted and
// created again.
func PositionKey(r *kgo.Record) string {
	return strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
}

// RecordKey is a key function for [WithKey] for topics whose record key
// identifies one event (not an aggregate whose events share it).
func RecordKey(r *kgo.Record) string { return string(r.Key) }

// Consumer runs a handler at most once per record key for a kgo group
// consumer, committing each partition's offsets only up to the records
// whose execution completed or that were parked. Create it with
// [NewConsumer], pass [Consumer.ClientOpts] to kgo.NewClient, then call
// [Consumer.Run].
type Consumer struct {
	e  *idem.Engine
	op string
	fn Func
	c  config

	mu      sync.Mutex
	stops   map[tp]chan struct{} // closed when the partition is revoked or lost
	running map[tp]chan struct{} // closed when the partition's current task returns
}

type tp struct {
	topic     string
	partition int32
}

// NewConsumer returns a Consumer running fn at most once per record key,
// through [idem.Do] with operation name op (required, e.g.
// "send-receipt"; two consumers of one topic need two names) on engine e.
// Every record is answered by Do's outcome ([idem.OutcomeOfError],
// [idem.Outcome.ConsumerAction]):
//
//	outcome                              answer                    log
//	fn returned nil, or a duplicate      commit (after the record is completed; a duplicate does not run fn)
//	fn's [idem.Permanent] error, now or  commit (stored, never     warn "permanent failure stored"
//	  for the first copy                   run again)
//	key-expired ([idem.ErrKeyExpired])   commit                    info "already processed once; its record expired"
//	response-not-stored                  commit                    info, as key-expired
//	  ([idem.ErrResultNotStored])
//	operation-uncertain ([idem.ErrUncertain], a step's uncertainty included),
//	stored-result-unreadable             park, then commit         warn "parked for an operator", with the
//	  ([idem.ErrCorrupt])                                          record key idemctl takes ([idem.Operation.RecordKey])
//	key-reused ([idem.ErrMismatch]),     park, then commit         warn "record dead-lettered"
//	  no key, a key too long
//	in progress ([idem.ErrInProgress])   retry in place after the  none; parked with a warning after
//	                                       retry delay               the in-progress limit
//	store unavailable, fn's transient    retry in place after the  warn "record to be retried"
//	  error                                retry delay
//	fn panics                            none: the key is released and the panic goes on
//
// To park is to produce the record (headers, key and value, plus
// [HeaderOutcome], [HeaderRecordKey], [HeaderError], [HeaderOrigin]) to
// the dead-letter topic ([WithDeadLetterTopic]) and wait for the broker's
// ack: an operator finds it there beside the warning naming its record,
// resolves the record (cmd/idemctl show, then complete or release it) and
// produces it again. A consumer that dies between the park and the commit
// parks the record a second time.
//
// Kafka has no per-record acknowledgement: a partition is consumed in
// order and its committed offset means "everything before is done". So a
// record that cannot be handled now is retried in place until it is
// handled, until the partition is revoked, or, for a key in progress
// elsewhere, until the in-progress limit parks it. The other partitions'
// records of the same poll go on meanwhile (and their offsets are
// committed), but the next poll waits for the retried partition's batch.
//
// A consumer that dies after a record completed but before its offset
// commit leaves the record completed; the redelivery is committed without
// running fn. One that dies while fn runs leaves the key in progress until
// its lease lapses (the engine's [idem.WithLease], 30s by default); the
// partition's next owner retries it in place meanwhile. A partition
// revoked while fn runs is handed over once fn returns and the done
// offsets are committed (kgo calls OnPartitionsRevoked, which waits; keep
// handlers shorter than the group's rebalance timeout, 60s by default);
// a record the new owner receives again is a duplicate to idem.
func NewConsumer(e *idem.Engine, op string, fn Func, opts ...Option) *Consumer {
	if e == nil || op == "" || fn == nil {
		panic("idemkafka: NewConsumer needs an engine, an operation name and a function")
	}
	c := config{
		key:        HeaderOrPositionKey,
		scope:      func(r *kgo.Record) string { return r.Topic },
		payload:    func(r *kgo.Record) []byte { return r.Value },
		deadLetter: func(r *kgo.Record) string { return r.Topic + DefaultDeadLetterSuffix },
		delay:      DefaultRetryDelay,
		inProgress: DefaultInProgressLimit,
		logger:     slog.Default(),
	}
	for _, o := range opts {
		o(&c)
	}
	return &Consumer{e: e, op: op, fn: fn, c: c, stops: make(map[tp]chan struct{}), running: make(map[tp]chan struct{})}
}

// ClientOpts returns the kgo options the consumer needs on its client, to
// add to the group's (kgo.ConsumerGroup, kgo.ConsumeTopics):
// kgo.AutoCommitMarks (only the offsets the consumer marks are
// committed, every 5s and by Run), kgo.OnPartitionsRevoked and
// kgo.OnPartitionsLost (the partition's handler is stopped after its
// current record; on revoke the done offsets are committed before the
// partition is handed over). Do not set those options yourself, nor
// kgo.BlockRebalanceOnPoll.
func (c *Consumer) ClientOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.AutoCommitMarks(),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
	}
}

// Run polls cl (a client made with [Consumer.ClientOpts]) and handles its
// records until ctx is done or cl is closed, then commits the done
// offsets. Partitions are handled concurrently, the records of one in
// order; fetch errors are logged (kgo retries them). Close cl after Run
// returns (kgo.Client.Close leaves the group).
func (c *Consumer) Run(ctx context.Context, cl *kgo.Client) {
	defer c.commit(cl)
	for {
		fs := cl.PollFetches(ctx)
		if fs.IsClientClosed() || ctx.Err() != nil {
			return
		}
		fs.EachError(func(topic string, partition int32, err error) {
			c.c.logger.WarnContext(ctx, "idemkafka: fetch failed", "topic", topic, "partition", partition, "err", err)
		})
		var wg sync.WaitGroup
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				wg.Go(func() { c.partition(ctx, cl, p) })
			}
		})
		wg.Wait()
		if err := cl.CommitMarkedOffsets(ctx); err != nil && ctx.Err() == nil {
			c.c.logger.WarnContext(ctx, "idemkafka: offset commit failed; the marked offsets are committed again later", "err", err)
		}
	}
}

// commit commits the marked offsets on the way out of Run.
func (c *Consumer) commit(cl *kgo.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		c.c.logger.Warn("idemkafka: final offset commit failed", "err", err)
	}
}

// partition handles p's records in order until one is left undone (the
// partition was revoked or ctx is done), marking each done one.
func (c *Consumer) partition(ctx context.Context, cl *kgo.Client, p kgo.FetchTopicPartition) {
	key := tp{p.Topic, p.Partition}
	c.mu.Lock()
	stop, ok := c.stops[key]
	if !ok {
		stop = make(chan struct{})
		c.stops[key] = stop
	}
	done := make(chan struct{})
	c.running[key] = done
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.running[key] == done {
			delete(c.running, key)
		}
		c.mu.Unlock()
		close(done)
	}()
	for _, r := range p.Records {
		select {
		case <-stop:
			return
		default:
		}
		if !c.handle(ctx, cl, stop, r) {
			return
		}
		cl.MarkCommitRecords(r)
	}
}

// handle runs r through idem until it is done (true: completed, stored,
// or parked) or stop or ctx ends the retries (false).
func (c *Consumer) handle(ctx context.Context, cl *kgo.Client, stop <-chan struct{}, r *kgo.Record) bool {
	var inProgressSince time.Time
	for {
		err, park := c.do(ctx, cl, r)
		o := idem.OutcomeOfError(err)
		if err != nil && o == idem.OutcomeInProgress {
			if inProgressSince.IsZero() {
				inProgressSince = time.Now()
			} else if time.Since(inProgressSince) >= c.c.inProgress {
				c.c.logger.WarnContext(ctx, "idemkafka: record in progress elsewhere beyond the in-progress limit, parked for an operator",
					"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "op", c.op, "limit", c.c.inProgress)
				park = true
			}
		}
		if park {
			if perr := c.park(ctx, cl, r, o, err); perr == nil {
				return true
			} else if ctx.Err() == nil {
				c.c.logger.WarnContext(ctx, "idemkafka: record could not be parked, to be retried", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", perr)
			}
		} else if err == nil || o.ConsumerAction() != idem.ConsumerRedeliver || errors.Is(err, idem.ErrPermanent) {
			return true
		}
		// Commit what is done before pausing: the other partitions' marks
		// are not held back by this one.
		_ = cl.CommitMarkedOffsets(ctx)
		t := time.NewTimer(c.c.delay)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			return false
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

// do runs r through idem once and logs its outcome; park says whether r
// is to be dead-lettered.
func (c *Consumer) do(ctx context.Context, cl *kgo.Client, r *kgo.Record) (err error, park bool) { //nolint:revive // err first reads as Do's result
	log := []any{"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "op", c.op}
	key := c.c.key(r)
	if key == "" {
		c.c.logger.WarnContext(ctx, "idemkafka: record without an idempotency key dead-lettered", log...)
		return idem.ErrKeyMissing, true
	}
	operation := idem.Operation{Scope: c.c.scope(r), Name: c.op, Key: key, Payload: c.c.payload(r)}
	_, err = idem.Do(ctx, c.e, operation, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, c.fn(ctx, r)
	})
	o := idem.OutcomeOfError(err)
	switch {
	case err == nil:
		return nil, false
	case errors.Is(err, idem.ErrPermanent):
		c.c.logger.WarnContext(ctx, "idemkafka: permanent failure stored, offset committed", append(log, "err", err)...)
		return err, false
	}
	switch o.ConsumerAction() {
	case idem.ConsumerAck:
		c.c.logger.InfoContext(ctx, "idemkafka: record committed: already processed once; its record expired", append(log, "outcome", o.String())...)
		return err, false
	case idem.ConsumerPark:
		c.c.logger.WarnContext(ctx, "idemkafka: record parked for an operator in the dead-letter topic: resolve its record with idemctl, then produce it again",
			append(log, "outcome", o.String(), "key", operation.RecordKey(), "dead_letter", c.c.deadLetter(r), "err", err)...)
		return err, true
	case idem.ConsumerDrop:
		c.c.logger.WarnContext(ctx, "idemkafka: record dead-lettered", append(log, "outcome", o.String(), "dead_letter", c.c.deadLetter(r), "err", err)...)
		return err, true
	default: // idem.ConsumerRedeliver
		if o != idem.OutcomeInProgress && ctx.Err() == nil {
			c.c.logger.WarnContext(ctx, "idemkafka: record to be retried", append(log, "delay", c.c.delay, "err", err)...)
		}
		return err, false
	}
}

// park produces r to its dead-letter topic and waits for the ack.
func (c *Consumer) park(ctx context.Context, cl *kgo.Client, r *kgo.Record, o idem.Outcome, cause error) error {
	headers := append(make([]kgo.RecordHeader, 0, len(r.Headers)+4), r.Headers...)
	var recordKey string
	if k := c.c.key(r); k != "" {
		recordKey = idem.Operation{Scope: c.c.scope(r), Name: c.op, Key: k}.RecordKey()
	}
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderOutcome, Value: []byte(o.String())},
		kgo.RecordHeader{Key: HeaderRecordKey, Value: []byte(recordKey)},
		kgo.RecordHeader{Key: HeaderError, Value: []byte(fmt.Sprint(cause))},
		kgo.RecordHeader{Key: HeaderOrigin, Value: []byte(r.Topic + "/" + PositionKey(r))},
	)
	dl := &kgo.Record{Topic: c.c.deadLetter(r), Key: r.Key, Value: r.Value, Headers: headers}
	return cl.ProduceSync(ctx, dl).FirstErr()
}

// revoked stops the revoked partitions' handlers after their current
// record, waits for them and commits the done offsets, before kgo hands
// the partitions over.
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	c.stop(revoked)
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		c.c.logger.WarnContext(ctx, "idemkafka: offset commit on revoke failed; the next owner handles the records again, as duplicates", "err", err)
	}
}

// lost stops the lost partitions' handlers and waits for them; their
// offsets cannot be committed any more.
func (c *Consumer) lost(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	if len(lost) > 0 {
		c.c.logger.WarnContext(ctx, "idemkafka: partitions lost (session expired or fenced); another member may have handled their records meanwhile, as duplicates to idem", "partitions", lost)
	}
	c.stop(lost)
}

func (c *Consumer) stop(parts map[string][]int32) {
	var wait []chan struct{}
	c.mu.Lock()
	for topic, ps := range parts {
		for _, p := range ps {
			key := tp{topic, p}
			if s, ok := c.stops[key]; ok {
				close(s)
				delete(c.stops, key)
			}
			if d, ok := c.running[key]; ok {
				wait = append(wait, d)
			}
		}
	}
	c.mu.Unlock()
	for _, d := range wait {
		<-d
	}
}
