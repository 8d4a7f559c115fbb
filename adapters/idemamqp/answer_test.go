package idemamqp

import (
	"testing"

	idem "github.com/idemkit/idem/core"
)

// TestEveryOutcomeMapped fails when core gains an outcome the handler
// does not answer.
func TestEveryOutcomeMapped(t *testing.T) {
	for _, o := range append(idem.Outcomes(), idem.OutcomeNone) {
		if answerOf(o) == unmapped {
			t.Errorf("outcome %q (%d) has no answer", o, o)
		}
	}
	for o, want := range map[idem.Outcome]answer{idem.OutcomeUncertain: park, idem.OutcomeKeyExpired: ack, idem.OutcomeInProgress: requeueQuiet, idem.OutcomeKeyReused: reject} {
		if answerOf(o) != want {
			t.Errorf("%s: answer %d, want %d", o, answerOf(o), want)
		}
	}
}
