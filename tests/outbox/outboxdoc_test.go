package outboxtest

import (
	"os"
	"strings"
	"testing"

	"github.com/idemkit/idem/adapters/idemamqp"
	"github.com/idemkit/idem/adapters/idemkafka"
	"github.com/idemkit/idem/adapters/idemnats"
	"github.com/idemkit/idem/outbox"
)

// The publishers the outbox's docs must name, each an outbox.BatchPublisher.
var (
	_ outbox.BatchPublisher = (*idemnats.Publisher)(nil)
	_ outbox.BatchPublisher = (*idemamqp.Publisher)(nil)
	_ outbox.BatchPublisher = (*idemkafka.Publisher)(nil)
)

// TestOutboxDocNamesBrokers: the outbox package doc names every publisher
// of this repository, and Message's Subject and Headers say what each
// broker makes of them.
func TestOutboxDocNamesBrokers(t *testing.T) {
	doc, err := os.ReadFile("../../outbox/doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"idemnats.Publisher", "idemamqp.Publisher", "idemkafka.Publisher"} {
		if !strings.Contains(string(doc), p) {
			t.Errorf("outbox/doc.go does not name %s", p)
		}
	}
	src, err := os.ReadFile("../../outbox/outbox.go")
	if err != nil {
		t.Fatal(err)
	}
	_, subject, _ := strings.Cut(string(src), "// Subject is where to publish")
	subject, _, _ = strings.Cut(subject, "Subject string")
	_, headers, _ := strings.Cut(string(src), "// Headers are sent with the message")
	headers, _, _ = strings.Cut(headers, "Headers map")
	for _, broker := range []string{"NATS", "AMQP", "Kafka"} {
		if !strings.Contains(subject, broker) || !strings.Contains(headers, broker) {
			t.Errorf("outbox.Message's Subject and Headers docs do not both say what %s makes of them", broker)
		}
	}
}
