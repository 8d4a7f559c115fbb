package idemamqp

import (
	"context"
	"errors"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	idem "github.com/idemkit/idem/core"
)

// Func handles one delivery. ctx carries the execution
// ([idem.InfoFromContext]; pgstore.Tx(ctx) for a transactional store).
// Return nil when done, an error to have the delivery requeued, or an error
// marked with [idem.Permanent] to have it stored and the delivery acked.
type Func func(ctx context.Context, d amqp.Delivery) error

// DefaultRetryDelay is the default pause before a requeue ([WithRetryDelay]).
const DefaultRetryDelay = time.Second

// Option configures [Handler].
type Option func(*config)

type config struct {
	key     func(amqp.Delivery) string
	scope   func(amqp.Delivery) string
	payload func(amqp.Delivery) []byte
	delay   time.Duration
	logger  *slog.Logger
}

// WithKey sets the function taking the idempotency key from a delivery; ""
// means it has none. Optional. Default is the MessageId property, which
// publishers set (amqp.Publishing.MessageId).
func WithKey(fn func(amqp.Delivery) string) Option { return func(c *config) { c.key = fn } }

// WithScope sets the function returning a delivery's scope
// ([idem.Operation.Scope]), e.g. the queue name or a tenant header.
// Optional. Default is "": the operation name alone scopes the key.
func WithScope(fn func(amqp.Delivery) string) Option { return func(c *config) { c.scope = fn } }

// WithPayload sets the function returning the bytes fingerprinted for a
// delivery ([idem.Operation.Payload]): a key seen again with another
// payload is rejected as a mismatch. Optional. Default is the body.
func WithPayload(fn func(amqp.Delivery) []byte) Option { return func(c *config) { c.payload = fn } }

// WithRetryDelay sets how long the handler waits before requeueing a
// delivery that cannot be handled now (in progress elsewhere, store
// unavailable, a transient error). AMQP 0-9-1 has no delayed requeue
// (Nack requeues at once), so the handler holds the delivery for this long
// before Nack(requeue): with a prefetch of 1 it paces that consumer instead
// of spinning. 0 requeues at once. For delays without holding a prefetch
// slot, dead-letter to a queue with a message TTL instead (RabbitMQ
// "Dead Letter Exchanges"). Optional. Default is 1s.
func WithRetryDelay(d time.Duration) Option { return func(c *config) { c.delay = d } }

// WithLogger sets where deliveries that are rejected or requeued are
// logged. Optional. Default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// Handler returns a function to call with each delivery of a channel
// consuming with autoAck false; it runs fn at most once per delivery key,
// through [idem.Do] with operation name op (required, e.g.
// "send-receipt"; two handlers of one queue need two names) on engine e,
// and answers each delivery itself, by Do's outcome
// ([idem.OutcomeOfError], [idem.Outcome.ConsumerAction]):
//
//	outcome                              answer                  log
//	fn returned nil, or a duplicate      Ack (after the record is completed; a duplicate does not run fn)
//	fn's [idem.Permanent] error, now or  Ack (stored, never      warn "permanent failure stored"
//	  for the first copy                   redelivered)
//	key-expired ([idem.ErrKeyExpired])   Ack                     info "already processed once; its record expired"
//	response-not-stored                  Ack                     info, as key-expired
//	  ([idem.ErrResultNotStored])
//	operation-uncertain ([idem.ErrUncertain], a step's uncertainty included),
//	stored-result-unreadable             Reject, no requeue      warn "parked for an operator", with the
//	  ([idem.ErrCorrupt])                  (dead-lettered)       record key idemctl takes ([idem.Operation.RecordKey])
//	key-reused ([idem.ErrMismatch]),     Reject, no requeue      warn "delivery rejected"
//	  no key, a key too long               (dead-lettered)
//	in progress ([idem.ErrInProgress])   Nack, requeue, after    none
//	                                       the retry delay
//	store unavailable, fn's transient    Nack, requeue, after    warn "delivery to be requeued"
//	  error                                the retry delay
//	fn panics                            none: the key is released and the panic goes on
//
// A key-expired delivery was processed once already (its record outlived
// the retention): running it again is what the tombstone prevents, so it
// is acknowledged. An uncertain one may or may not have taken effect: it
// is neither run again nor requeued in a loop, but rejected without
// requeue, which moves it to the queue's dead-letter exchange when the
// queue has one (x-dead-letter-exchange; RabbitMQ "Dead Letter
// Exchanges"), where an operator finds it beside the warning naming its
// record: resolve the record (cmd/idemctl show, then complete or release
// it) and republish the message. Give queues a dead-letter exchange: without
// one a rejected delivery is dropped, and only the log names it.
//
// ctx bounds the handler and the retry delay. A consumer that dies before
// its Ack leaves the record completed; the redelivery is acked without
// running fn. One that dies while fn runs leaves the key in progress until
// its lease lapses (the engine's [idem.WithLease], 30s by default): a
// queue's delivery limit (quorum queues: delivery-limit, 20 by default
// since RabbitMQ 4.0) times the retry delay must outlast it, or the
// message is dropped or dead-lettered before it runs again.
func Handler(e *idem.Engine, op string, fn Func, opts ...Option) func(ctx context.Context, d amqp.Delivery) {
	if e == nil || op == "" || fn == nil {
		panic("idemamqp: Handler needs an engine, an operation name and a function")
	}
	c := config{
		key:     func(d amqp.Delivery) string { return d.MessageId },
		scope:   func(amqp.Delivery) string { return "" },
		payload: func(d amqp.Delivery) []byte { return d.Body },
		delay:   DefaultRetryDelay,
		logger:  slog.Default(),
	}
	for _, o := range opts {
		o(&c)
	}
	return func(ctx context.Context, d amqp.Delivery) {
		key := c.key(d)
		if key == "" {
			c.logger.WarnContext(ctx, "idemamqp: delivery without an idempotency key rejected", "routing_key", d.RoutingKey, "op", op)
			_ = d.Reject(false)
			return
		}
		operation := idem.Operation{Scope: c.scope(d), Name: op, Key: key, Payload: c.payload(d)}
		_, err := idem.Do(ctx, e, operation, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, fn(ctx, d)
		})
		o := idem.OutcomeOfError(err)
		switch {
		case err == nil:
			_ = d.Ack(false)
		case errors.Is(err, idem.ErrPermanent):
			c.logger.WarnContext(ctx, "idemamqp: permanent failure stored, delivery acked", "routing_key", d.RoutingKey, "op", op, "err", err)
			_ = d.Ack(false)
		default:
			switch o.ConsumerAction() {
			case idem.ConsumerAck:
				c.logger.InfoContext(ctx, "idemamqp: delivery acked: already processed once; its record expired", "routing_key", d.RoutingKey, "op", op, "outcome", o.String())
				_ = d.Ack(false)
			case idem.ConsumerPark:
				c.logger.WarnContext(ctx, "idemamqp: delivery rejected and parked for an operator (dead-lettered if the queue has a dead-letter exchange): resolve its record with idemctl, then republish it",
					"routing_key", d.RoutingKey, "op", op, "outcome", o.String(), "key", operation.RecordKey(), "err", err)
				_ = d.Reject(false)
			case idem.ConsumerDrop:
				c.logger.WarnContext(ctx, "idemamqp: delivery rejected", "routing_key", d.RoutingKey, "op", op, "outcome", o.String(), "err", err)
				_ = d.Reject(false)
			default: // idem.ConsumerRedeliver
				if o != idem.OutcomeInProgress {
					c.logger.WarnContext(ctx, "idemamqp: delivery to be requeued", "routing_key", d.RoutingKey, "op", op, "delay", c.delay, "err", err)
				}
				pause(ctx, c.delay)
				_ = d.Nack(false, true)
			}
		}
	}
}

// pause waits d or until ctx is done.
func pause(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
