package idem_test

import (
	"fmt"

	idem "github.com/idemkit/idem/core"
)

// A door decides by outcome: a wrapped uncertainty from Do is a 409 that
// must not be retried, and a message consumer parks it for an operator.
func ExampleOutcomeOfError() {
	err := fmt.Errorf("charging: %w", idem.ErrUncertain)
	o := idem.OutcomeOfError(err)
	fmt.Println(o, o.Status(), o.Retryable(), o.ConsumerAction() == idem.ConsumerPark)
	fmt.Println(idem.OutcomeInProgress, idem.OutcomeInProgress.Status(), idem.OutcomeInProgress.Retryable())
	// Output:
	// operation-uncertain 409 false true
	// in-progress 409 true
}
