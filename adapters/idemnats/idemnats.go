package idemnats

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	idem "github.com/idemkit/idem/core"
)

// Func handles one JetStream message. ctx carries the execution
// ([idem.InfoFromContext]; pgstore.Tx(ctx) for a transactional store).
// Return nil when done, an error to have the message redelivered, or an
// error marked with [idem.Permanent] to have it stored and the message
// terminated.
type Func func(ctx context.Context, msg jetstream.Msg) error

// DefaultRetryDelay is the default redelivery delay ([WithRetryDelay]).
const DefaultRetryDelay = time.Second

// Option configures [Handler].
type Option func(*config)

type config struct {
	key     func(jetstream.Msg) string
	scope   func(jetstream.Msg) string
	payload func(jetstream.Msg) []byte
	delay   time.Duration
	ctx     context.Context
	logger  *slog.Logger
}

// WithKey sets the function taking the idempotency key from a message; ""
// means the message has none. Optional. Default is the Nats-Msg-Id header
// (jetstream.MsgIDHeader), the id JetStream itself deduplicates publishes
// by within the stream's duplicate window; idem keeps it for the engine's
// retention.
func WithKey(fn func(jetstream.Msg) string) Option { return func(c *config) { c.key = fn } }

// WithScope sets the function returning a message's scope
// ([idem.Operation.Scope]). Optional. Default is the stream name from the
// message's metadata.
func WithScope(fn func(jetstream.Msg) string) Option { return func(c *config) { c.scope = fn } }

// WithPayload sets the function returning the bytes fingerprinted for a
// message ([idem.Operation.Payload]): a key seen again with another payload
// is terminated as a mismatch. Optional. Default is the message body.
func WithPayload(fn func(jetstream.Msg) []byte) Option { return func(c *config) { c.payload = fn } }

// WithRetryDelay sets the delay of the NakWithDelay sent when the message
// cannot be handled now: in progress elsewhere, store unavailable, or a
// transient error of the handler. Optional. Default is 1s.
func WithRetryDelay(d time.Duration) Option { return func(c *config) { c.delay = d } }

// WithContext sets the context handlers run under (jetstream calls
// message handlers without one). Optional. Default is context.Background().
func WithContext(ctx context.Context) Option { return func(c *config) { c.ctx = ctx } }

// WithLogger sets where messages that are terminated or redelivered are
// logged. Optional. Default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// Handler returns a jetstream.MessageHandler (for Consumer.Consume, or
// called on each message of Fetch or Messages) that runs fn at most once
// per message key, through [idem.Do] with operation name op (required,
// e.g. "send-receipt"; two handlers of one stream need two names) on engine
// e. It answers every message itself, by Do's outcome ([idem.OutcomeOfError],
// [idem.Outcome.ConsumerAction]):
//
//	outcome                              answer          log
//	fn returned nil, or a duplicate      Ack (after the record is completed; a duplicate does not run fn)
//	fn's [idem.Permanent] error, now or  Term            warn "message terminated"
//	  for the first copy (stored)
//	key-expired ([idem.ErrKeyExpired])   Ack             info "already processed once; its record expired"
//	response-not-stored                  Ack             info "already processed once; its record expired"
//	  ([idem.ErrResultNotStored])
//	operation-uncertain ([idem.ErrUncertain], a step's uncertainty included),
//	stored-result-unreadable             Term            warn "parked for an operator", with the record
//	  ([idem.ErrCorrupt])                                key idemctl takes ([idem.Operation.RecordKey])
//	key-reused ([idem.ErrMismatch]),     Term            warn "message terminated"
//	  no key, a key too long
//	in progress ([idem.ErrInProgress])   NakWithDelay    none
//	store unavailable, fn's transient    NakWithDelay    warn "message to be redelivered"
//	  error
//	fn panics                            none: the key is released and the panic goes on
//
// A key-expired message was processed once already (its record outlived
// the retention): running it again is what the tombstone prevents, so it
// is acknowledged. An uncertain one may or may not have taken effect: it
// is neither run again nor cycled through redeliveries until MaxDeliver
// drops it silently, but terminated with a warning naming the record,
// for an operator to resolve (cmd/idemctl show, then complete or release
// it and republish the message); JetStream also publishes a
// MSG_TERMINATED advisory for it. Term, never TermWithReason: servers
// before 2.10.4 ignore the reason's form and redeliver the message.
//
// A consumer that dies before its Ack leaves the record completed; the
// redelivery is acked without running fn. One that dies while fn runs
// leaves the key in progress until its lease lapses (the engine's
// [idem.WithLease], 30s by default): give the consumer a MaxDeliver (and
// the handler a retry delay) that outlast it, or the message is dropped
// before it runs again.
func Handler(e *idem.Engine, op string, fn Func, opts ...Option) jetstream.MessageHandler {
	if e == nil || op == "" || fn == nil {
		panic("idemnats: Handler needs an engine, an operation name and a function")
	}
	c := config{
		key:     func(m jetstream.Msg) string { return m.Headers().Get(jetstream.MsgIDHeader) },
		scope:   streamName,
		payload: jetstream.Msg.Data,
		delay:   DefaultRetryDelay,
		ctx:     context.Background(),
		logger:  slog.Default(),
	}
	for _, o := range opts {
		o(&c)
	}
	return func(msg jetstream.Msg) {
		key := c.key(msg)
		if key == "" {
			c.logger.WarnContext(c.ctx, "idemnats: message without an idempotency key terminated", "subject", msg.Subject(), "op", op)
			_ = msg.Term()
			return
		}
		operation := idem.Operation{Scope: c.scope(msg), Name: op, Key: key, Payload: c.payload(msg)}
		_, err := idem.Do(c.ctx, e, operation, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, fn(ctx, msg)
		})
		o := idem.OutcomeOfError(err)
		switch {
		case err == nil:
			_ = msg.Ack()
		case errors.Is(err, idem.ErrPermanent):
			c.logger.WarnContext(c.ctx, "idemnats: message terminated", "subject", msg.Subject(), "op", op, "err", err)
			_ = msg.Term()
		default:
			switch o.ConsumerAction() {
			case idem.ConsumerAck:
				c.logger.InfoContext(c.ctx, "idemnats: message acked: already processed once; its record expired", "subject", msg.Subject(), "op", op, "outcome", o.String())
				_ = msg.Ack()
			case idem.ConsumerPark:
				c.logger.WarnContext(c.ctx, "idemnats: message terminated and parked for an operator: resolve its record with idemctl, then republish it",
					"subject", msg.Subject(), "op", op, "outcome", o.String(), "key", operation.RecordKey(), "err", err)
				_ = msg.Term()
			case idem.ConsumerDrop:
				c.logger.WarnContext(c.ctx, "idemnats: message terminated", "subject", msg.Subject(), "op", op, "outcome", o.String(), "err", err)
				_ = msg.Term()
			default: // idem.ConsumerRedeliver
				if o != idem.OutcomeInProgress {
					c.logger.WarnContext(c.ctx, "idemnats: message to be redelivered", "subject", msg.Subject(), "op", op, "delay", c.delay, "err", err)
				}
				_ = msg.NakWithDelay(c.delay)
			}
		}
	}
}

// streamName is the default scope: the message's stream, or "" when its
// metadata is unreadable (not a JetStream message).
func streamName(m jetstream.Msg) string {
	md, err := m.Metadata()
	if err != nil {
		return ""
	}
	return md.Stream
}

// SequenceKey is a key function for [WithKey] for streams whose publishers
// set no Nats-Msg-Id: the message's stream sequence, the same for every
// redelivery of one stored message (but not for a message published twice,
// and reused if the stream is deleted and created again).
func SequenceKey(m jetstream.Msg) string {
	md, err := m.Metadata()
	if err != nil {
		return ""
	}
	return strconv.FormatUint(md.Sequence.Stream, 10)
}
