package idemnats

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/outbox"
)

// Publisher publishes an outbox's messages to JetStream for an
// [outbox.Relay]: the message's ID goes in the Nats-Msg-Id header, so the
// stream drops a copy published again (by a relay that died between the
// PubAck and its sent mark) within its duplicate window (the stream's
// Duplicates, 2 minutes by default; the PubAck then says Duplicate). A
// copy published after the window is stored and delivered again; idem's
// [Handler] acks it without running the handler, by the same id, for the
// engine's retention. Publish waits for the PubAck (the stream stored the
// message, on a majority of an R3 stream's replicas).
type Publisher struct {
	js jetstream.JetStream
}

var _ outbox.BatchPublisher = (*Publisher)(nil)

// NewPublisher returns a Publisher on js (borrowed: never closed). The
// message's Subject must be bound to a stream; one that is not fails with
// jetstream.ErrNoStreamResponse, and the relay retries it with backoff.
func NewPublisher(js jetstream.JetStream) *Publisher {
	if js == nil {
		panic("idemnats: NewPublisher needs a JetStream context")
	}
	return &Publisher{js: js}
}

// Publish implements [outbox.Publisher]: it publishes m with its headers
// and Nats-Msg-Id set to m.ID and waits for the PubAck within ctx.
func (p *Publisher) Publish(ctx context.Context, m outbox.Message) error {
	if _, err := p.js.PublishMsg(ctx, natsMsg(m)); err != nil {
		return fmt.Errorf("idemnats: publish %q to %s: %w", m.ID, m.Subject, err)
	}
	return nil
}

// PublishBatch implements [outbox.BatchPublisher]: it publishes msgs
// asynchronously (PublishMsgAsync) and waits for each PubAck within ctx.
// A message whose PubAck did not come may still be stored; the relay
// publishes it again, and the stream drops the copy within its
// duplicate window.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		futures[i], errs[i] = p.js.PublishMsgAsync(natsMsg(m))
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs[i] = err
		case <-ctx.Done():
			errs[i] = ctx.Err()
		}
	}
	for i, err := range errs {
		if err != nil {
			errs[i] = fmt.Errorf("idemnats: publish %q to %s: %w", msgs[i].ID, msgs[i].Subject, err)
		}
	}
	return errs
}

// natsMsg is m as a NATS message: headers, then Nats-Msg-Id = m.ID.
func natsMsg(m outbox.Message) *nats.Msg {
	msg := nats.NewMsg(m.Subject)
	msg.Data = m.Payload
	for k, v := range m.Headers {
		msg.Header.Set(k, v)
	}
	msg.Header.Set(jetstream.MsgIDHeader, m.ID)
	return msg
}
