package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"time"

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
// use (serialised on one channel; a call waits for the one in progress
// within its own context).
//
// Every wait of a call (for the channel, a dial, a socket write, a
// confirm) ends when its context does: the call then returns ctx's error
// for the messages not confirmed, closes the connection (a confirm may
// still come for them, so the channel's sequence is no longer known) and
// the next call dials again. So does a connection or channel that ends in
// any other way (the broker unreachable, restarted, or closing the
// channel), and a connection the broker blocks (a resource alarm) fails
// the calls made while it is blocked at once, with [ErrBlocked].
type Publisher struct {
	dial     func() (*amqp.Connection, error)
	exchange string

	// sem holds one token while a call uses the fields below.
	sem     chan struct{}
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	blocks  chan amqp.Blocking
	closes  chan *amqp.Error
	blocked string      // the broker's reason while it blocks the connection
	isBlock bool        // the broker blocks the connection
	dialing chan dialed // a dial a call gave up waiting for, or nil
}

// dialed is the outcome of a dial and channel opening run in the
// background.
type dialed struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	blocks  chan amqp.Blocking
	closes  chan *amqp.Error
	err     error
}

// ErrBlocked is returned (wrapped, with the broker's reason) by
// [Publisher.Publish] while RabbitMQ blocks the publisher's connection
// (connection.blocked: a memory or disk alarm): nothing is sent, and the
// relay backs off and publishes the message again.
var ErrBlocked = errors.New("idemamqp: connection blocked by the broker")

var _ outbox.BatchPublisher = (*Publisher)(nil)

// NewPublisher returns a Publisher to exchange ("" for the default
// exchange, which routes by queue name) whose connections dial opens, e.g.
// func() (*amqp.Connection, error) { return amqp.Dial(url) }: the first
// Publish dials, and the next one after a connection or channel failure
// (the broker restarted) dials again. A dial outlasting the call's context
// goes on in the background (amqp.Dial bounds it, 30s by default) and the
// next call takes its connection. Messages' Subject is the routing key.
// Close closes the connection.
func NewPublisher(dial func() (*amqp.Connection, error), exchange string) *Publisher {
	if dial == nil {
		panic("idemamqp: NewPublisher needs a dial function")
	}
	return &Publisher{dial: dial, exchange: exchange, sem: make(chan struct{}, 1)}
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

// closeTimeout bounds the close handshake of a connection the publisher
// gives up (and the call's context bounds it too).
const closeTimeout = time.Second

// PublishBatch implements [outbox.BatchPublisher]: it publishes msgs as
// Publish does, without waiting for one confirm before sending the next
// (at most 256 in flight), and waits for their confirms within ctx.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	if !p.acquire(ctx) {
		for i, m := range msgs {
			errs[i] = fmt.Errorf("idemamqp: publish %q: waiting for the channel: %w", m.ID, ctx.Err())
		}
		return errs
	}
	defer p.release()
	for start := 0; start < len(msgs); start += returnsBuffer {
		end := min(len(msgs), start+returnsBuffer)
		p.publishLocked(ctx, msgs[start:end], errs[start:end])
	}
	return errs
}

// acquire takes the publisher's token, or reports false when ctx ends first.
func (p *Publisher) acquire(ctx context.Context) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case p.sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (p *Publisher) release() { <-p.sem }

// publishLocked publishes msgs and sets errs, one per message.
func (p *Publisher) publishLocked(ctx context.Context, msgs []outbox.Message, errs []error) {
	fail := func(from int, err error) {
		for j := from; j < len(msgs); j++ {
			if errs[j] == nil {
				errs[j] = fmt.Errorf("idemamqp: publish %q: %w", msgs[j].ID, err)
			}
		}
	}
	if err := p.open(ctx); err != nil {
		fail(0, err)
		return
	}
	if p.blockedNow() {
		fail(0, fmt.Errorf("%w: %s", ErrBlocked, p.blocked))
		return
	}
	// A socket write blocks while the broker reads nothing (a network
	// partition, a blocked connection): when ctx ends, closing the
	// connection with a past deadline fails that write.
	conn := p.conn
	closing := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(closing)
		_ = conn.CloseDeadline(time.Now())
	})
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	broken := false
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
			fail(i, err)
			broken = true
			break
		}
		confirms[i] = dc
	}
	for i, m := range msgs {
		if confirms[i] == nil {
			continue
		}
		acked, err := confirms[i].WaitContext(ctx)
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("idemamqp: confirm of %q: %w", m.ID, err)
			broken = true // a confirm may still come: this channel's sequence is no longer known
		case !acked && p.ch.IsClosed():
			// The library nacks what is pending when the channel ends.
			errs[i] = fmt.Errorf("idemamqp: confirm of %q: %w", m.ID, p.closeReason())
			broken = true
		case !acked:
			errs[i] = fmt.Errorf("%w: %q nacked", ErrNotConfirmed, m.ID)
		}
	}
	// A basic.return precedes its message's confirm on the channel, and the
	// library delivers it first: every return of this batch is buffered now
	// (or the channel is closed, and its returns channel with it).
	if !p.drainReturns(msgs, errs) {
		broken = true
	}
	if !stop() {
		<-closing
		broken = true
	}
	if broken {
		p.closeLocked(ctx)
	}
}

// drainReturns marks the messages of msgs the broker returned, from the
// returns buffered now; false means the returns channel is closed.
func (p *Publisher) drainReturns(msgs []outbox.Message, errs []error) bool {
	for {
		select {
		case r, ok := <-p.returns:
			if !ok {
				return false
			}
			for i, m := range msgs {
				if m.ID == r.MessageId && errs[i] == nil {
					errs[i] = fmt.Errorf("%w: %q returned by %q: %d %s", ErrNotConfirmed, m.ID, p.exchange, r.ReplyCode, r.ReplyText)
				}
			}
		default:
			return true
		}
	}
}

// blockedNow reads the blocked and unblocked notifications received since
// the last call and reports whether the broker blocks the connection.
func (p *Publisher) blockedNow() bool {
	for {
		select {
		case b, ok := <-p.blocks:
			if !ok {
				return p.isBlock
			}
			p.isBlock, p.blocked = b.Active, b.Reason
		default:
			return p.isBlock
		}
	}
}

// closeReason returns why the channel closed: the broker's or the
// connection's error, or amqp.ErrClosed.
func (p *Publisher) closeReason() error {
	select {
	case e, ok := <-p.closes:
		if ok && e != nil {
			return fmt.Errorf("channel closed: %w", e)
		}
	default:
	}
	return fmt.Errorf("channel closed: %w", amqp.ErrClosed)
}

// open makes sure a connection and a confirm channel are open: it dials
// unless they are, in the background, and waits for that dial within ctx.
func (p *Publisher) open(ctx context.Context) error {
	if p.ch != nil && !p.ch.IsClosed() && !p.conn.IsClosed() {
		return nil
	}
	p.closeLocked(ctx)
	if p.dialing == nil {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("idemamqp: dial: %w", err)
		}
		d := make(chan dialed, 1)
		p.dialing = d
		go func() { d <- p.connect() }()
	}
	select {
	case d := <-p.dialing:
		p.dialing = nil
		if d.err != nil {
			return d.err
		}
		p.conn, p.ch, p.returns, p.blocks, p.closes = d.conn, d.ch, d.returns, d.blocks, d.closes
		p.isBlock, p.blocked = false, ""
		return nil
	case <-ctx.Done():
		return fmt.Errorf("idemamqp: dial: %w", ctx.Err())
	}
}

// connect dials and opens a confirm channel.
func (p *Publisher) connect() dialed {
	conn, err := p.dial()
	if err != nil {
		return dialed{err: fmt.Errorf("idemamqp: dial: %w", err)}
	}
	// Registered before the channel opens: a connection blocked from the
	// start is told right after the handshake.
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 8))
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
		return dialed{err: fmt.Errorf("idemamqp: open a confirm channel: %w", err)}
	}
	return dialed{
		conn: conn, ch: ch, blocks: blocks,
		returns: ch.NotifyReturn(make(chan amqp.Return, returnsBuffer)),
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}
}

// closeLocked closes the connection, waiting for the broker's answer at
// most closeTimeout and not past ctx's deadline.
func (p *Publisher) closeLocked(ctx context.Context) {
	if p.conn != nil {
		deadline := time.Now().Add(closeTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		if ctx.Err() != nil {
			deadline = time.Now()
		}
		_ = p.conn.CloseDeadline(deadline)
	}
	p.conn, p.ch, p.returns, p.blocks, p.closes = nil, nil, nil, nil, nil
}

// Close closes the publisher's connection, after the call in progress
// (bounded by its context) and a dial in progress (bounded by the dial's
// own timeouts); a later Publish dials again.
func (p *Publisher) Close() error {
	p.sem <- struct{}{}
	defer p.release()
	if p.dialing != nil {
		if d := <-p.dialing; d.conn != nil {
			_ = d.conn.CloseDeadline(time.Now().Add(closeTimeout))
		}
		p.dialing = nil
	}
	p.closeLocked(context.Background())
	return nil
}
