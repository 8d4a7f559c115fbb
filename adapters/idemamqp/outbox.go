package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/outbox"
)

// ErrNotConfirmed is returned (wrapped) by [Publisher.Publish] when
// RabbitMQ nacked the message or returned it as unroutable (no queue bound
// to its routing key): it is not stored, and the relay publishes it again.
var ErrNotConfirmed = errors.New("idemamqp: message not confirmed")

// Publisher publishes an outbox's messages to RabbitMQ for an
// [outbox.Relay], with publisher confirms: Publish returns nil once the
// broker confirmed the message (persistent, mandatory: routed to at least
// one queue). The message's ID is the AMQP message-id property, the key
// idem's [Handler] dedupes deliveries by, so a copy published again (by a
// relay that died between the confirm and its sent mark) is acked without
// running the handler. Publish and PublishBatch are safe for concurrent
// use (serialised on one channel).
type Publisher struct {
	dial     func() (*amqp.Connection, error)
	exchange string

	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

var _ outbox.BatchPublisher = (*Publisher)(nil)

// NewPublisher returns a Publisher to exchange ("" for the default
// exchange, which routes by queue name) whose connections dial opens, e.g.
// func() (*amqp.Connection, error) { return amqp.Dial(url) }: the first
// Publish dials, and the next one after a connection or channel failure
// (the broker restarted) dials again. Messages' Subject is the routing
// key. Close closes the connection.
func NewPublisher(dial func() (*amqp.Connection, error), exchange string) *Publisher {
	if dial == nil {
		panic("idemamqp: NewPublisher needs a dial function")
	}
	return &Publisher{dial: dial, exchange: exchange}
}

// Publish implements [outbox.Publisher]: it publishes m persistent and
// mandatory, with its headers and message-id m.ID, and waits for the
// broker's confirm within ctx.
func (p *Publisher) Publish(ctx context.Context, m outbox.Message) error {
	return p.PublishBatch(ctx, []outbox.Message{m})[0]
}

// returnsBuffer bounds the messages PublishBatch has in flight at once:
// the broker's returns of unroutable ones are buffered until it reads
// them.
const returnsBuffer = 256

// PublishBatch implements [outbox.BatchPublisher]: it publishes msgs as
// Publish does, without waiting for one confirm before sending the next
// (at most 256 in flight), and waits for their confirms within ctx.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []outbox.Message) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, len(msgs))
	for start := 0; start < len(msgs); start += returnsBuffer {
		end := min(len(msgs), start+returnsBuffer)
		p.publishLocked(ctx, msgs[start:end], errs[start:end])
	}
	return errs
}

// publishLocked publishes msgs and sets errs, one per message.
func (p *Publisher) publishLocked(ctx context.Context, msgs []outbox.Message, errs []error) {
	if err := p.open(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return
	}
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		var headers amqp.Table
		if len(m.Headers) > 0 {
			headers = make(amqp.Table, len(m.Headers))
			for k, v := range m.Headers {
				headers[k] = v
			}
		}
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, p.exchange, m.Subject, true, false, amqp.Publishing{
			MessageId: m.ID, Headers: headers, DeliveryMode: amqp.Persistent, Timestamp: m.Enqueued, Body: m.Payload,
		})
		if err != nil {
			for j := i; j < len(msgs); j++ {
				errs[j] = fmt.Errorf("idemamqp: publish %q: %w", msgs[j].ID, err)
			}
			break
		}
		confirms[i] = dc
	}
	broken := errs[len(errs)-1] != nil
	for i, m := range msgs {
		if confirms[i] == nil {
			continue
		}
		acked, err := confirms[i].WaitContext(ctx)
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("idemamqp: confirm of %q: %w", m.ID, err)
			broken = true // a confirm may still come: this channel's sequence is no longer known
		case !acked:
			errs[i] = fmt.Errorf("%w: %q nacked", ErrNotConfirmed, m.ID)
		}
	}
	// A basic.return precedes its message's confirm on the channel, and the
	// library delivers it first: every return of this batch is buffered now.
	for {
		select {
		case r := <-p.returns:
			for i, m := range msgs {
				if m.ID == r.MessageId && errs[i] == nil {
					errs[i] = fmt.Errorf("%w: %q returned by %q: %d %s", ErrNotConfirmed, m.ID, p.exchange, r.ReplyCode, r.ReplyText)
				}
			}
			continue
		default:
		}
		break
	}
	if broken {
		p.closeLocked()
	}
}

// open dials and opens a confirm channel unless both are open.
func (p *Publisher) open() error {
	if p.ch != nil && !p.ch.IsClosed() {
		return nil
	}
	p.closeLocked()
	conn, err := p.dial()
	if err != nil {
		return fmt.Errorf("idemamqp: dial: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("idemamqp: open a confirm channel: %w", err)
	}
	p.conn, p.ch = conn, ch
	p.returns = ch.NotifyReturn(make(chan amqp.Return, returnsBuffer))
	return nil
}

func (p *Publisher) closeLocked() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.conn, p.ch = nil, nil
}

// Close closes the publisher's connection; a later Publish dials again.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLocked()
	return nil
}
