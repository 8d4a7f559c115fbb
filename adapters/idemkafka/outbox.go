package idemkafka

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/outbox"
)

// Publisher publishes an outbox's messages to Kafka for an
// [outbox.Relay]: a message becomes a record of topic m.Subject whose key
// is the message's ordering key m.Key (no key when empty), whose value is
// m.Payload, and whose headers are m.Headers plus the Idempotency-Key
// header ([KeyHeader]) set to m.ID, the key idem's [Consumer] dedupes
// records by. Publish returns nil once the broker acked the record
// (kgo's default acks=all on an idempotent producer: every in-sync
// replica has it).
//
// Order: the record key picks the partition (kgo's default partitioner
// hashes it as the Java client does), so one key's messages land in one
// partition, in the relay's order: the relay sends a key's next message
// only after its predecessor's ack. Duplicates: the idempotent producer
// drops a batch the client retried after a lost ack within its producer
// session; a message published again by a relay that died between the
// ack and its sent mark is stored twice, and the consumer, keyed by the
// header, runs it once. Kafka transactions would add nothing here: they
// make records atomic with one another and with a consumer's offsets,
// not with the outbox's database, so the relay's crash window between the
// ack and the sent mark stays, and it is the consumer's key that absorbs
// it.
type Publisher struct {
	cl *kgo.Client
}

var _ outbox.BatchPublisher = (*Publisher)(nil)

// NewPublisher returns a Publisher on cl (borrowed: never closed), a
// client with kgo's default idempotent producer (do not set
// kgo.DisableIdempotentWrite, nor kgo.RequiredAcks below AllISRAcks). A
// topic that does not exist fails the publish (unless the cluster creates
// topics on produce, kgo.AllowAutoTopicCreation), and the relay retries it
// with backoff.
func NewPublisher(cl *kgo.Client) *Publisher {
	if cl == nil {
		panic("idemkafka: NewPublisher needs a client")
	}
	return &Publisher{cl: cl}
}

// Publish implements [outbox.Publisher]: it produces m and waits for the
// broker's ack within ctx.
func (p *Publisher) Publish(ctx context.Context, m outbox.Message) error {
	return p.PublishBatch(ctx, []outbox.Message{m})[0]
}

// PublishBatch implements [outbox.BatchPublisher]: it produces msgs
// without waiting for one ack before sending the next, and waits for
// their acks within ctx. A message whose ack did not come in time may
// still be stored; the relay publishes it again.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	results := make(chan result, len(msgs)) // buffered: an ack after ctx is done does not block kgo
	for i, m := range msgs {
		p.cl.Produce(ctx, record(m), func(_ *kgo.Record, err error) { results <- result{i, err} })
	}
	acked := make([]bool, len(msgs))
	for range msgs {
		select {
		case r := <-results:
			acked[r.i] = true
			if r.err != nil {
				errs[r.i] = fmt.Errorf("idemkafka: publish %q to %s: %w", msgs[r.i].ID, msgs[r.i].Subject, r.err)
			}
		case <-ctx.Done():
			for i := range msgs {
				if !acked[i] {
					errs[i] = fmt.Errorf("idemkafka: publish %q to %s: no ack: %w", msgs[i].ID, msgs[i].Subject, ctx.Err())
				}
			}
			return errs // the relay publishes the unacked ones again
		}
	}
	return errs
}

type result struct {
	i   int
	err error
}

// record is m as a Kafka record.
func record(m outbox.Message) *kgo.Record {
	r := &kgo.Record{Topic: m.Subject, Value: m.Payload, Headers: make([]kgo.RecordHeader, 0, len(m.Headers)+1)}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	for k, v := range m.Headers {
		if k != KeyHeader {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: KeyHeader, Value: []byte(m.ID)})
	return r
}
