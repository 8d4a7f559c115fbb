package idemkafka_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/adapters/idemkafka"
)

// TestDocRestartClaims: what the package doc says a restart costs and
// where parked records go holds for the kgo this module builds with: the
// session timeout it names is kgo's default, and the dead-letter suffix
// is DefaultDeadLetterSuffix.
func TestDocRestartClaims(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	cl, err := kgo.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	session, ok := cl.OptValue(kgo.SessionTimeout).(time.Duration)
	if !ok {
		t.Fatalf("kgo's SessionTimeout option value is %T", cl.OptValue(kgo.SessionTimeout))
	}
	for _, want := range []string{
		"(kgo.SessionTimeout, " + session.String() + " by default)", // kgo's default
		"kgo.InstanceID",
		"record's topic plus \"" + idemkafka.DefaultDeadLetterSuffix + "\"",
		"The consumer does not create it",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("doc.go does not say %q", want)
		}
	}
}
