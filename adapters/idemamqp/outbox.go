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
// running the handler. Publish is safe for concurrent use (serialised on
// one channel).
type Publisher struct {
	dial     func() (*amqp.Connection, error)
	exchange string

	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

var _ outbox.Publisher = (*Publisher)(nil)

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
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.open(); err != nil {
		return err
	}
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
		p.closeLocked()
		return fmt.Errorf("idemamqp: publish %q: %w", m.ID, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		p.closeLocked() // the confirm may still come: this channel's sequence is no longer known
		return fmt.Errorf("idemamqp: confirm of %q: %w", m.ID, err)
	}
	// A basic.return precedes the confirm on the channel, and the library
	// delivers it first.
	select {
	case r := <-p.returns:
		return fmt.Errorf("%w: %q returned by %s: %d %s", ErrNotConfirmed, m.ID, p.exchange, r.ReplyCode, r.ReplyText)
	default:
	}
	if !acked {
		return fmt.Errorf("%w: %q nacked", ErrNotConfirmed, m.ID)
	}
	return nil
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
	p.returns = ch.NotifyReturn(make(chan amqp.Return, 1))
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
