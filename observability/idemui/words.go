package idemui

import (
	"fmt"

	idem "github.com/idemkit/idem/core"
)

// The questions an operator answers before an action, shared by the
// console's confirmation pages and cmd/idemctl's prompts, so that both
// say the same of what happens to the record and its steps.

// EvictQuestion asks to evict a record in state.
func EvictQuestion(state idem.State) string {
	what := "A retry with this key will execute the request again."
	if state == idem.StateInProgress {
		what = "Its handler must no longer be running: a retry with this key will execute the request again."
	}
	return fmt.Sprintf("Evict this %s record? %s", state, what)
}

// EvictSteps says what evicting does to a record's steps.
const EvictSteps = "Its steps' journal goes with it: every step runs again, those already done included."

// ReleaseQuestion asks to release an uncertain record.
const ReleaseQuestion = "Release this uncertain record? Only if the operation did not take effect: the next retry with this key executes it."

// ReleaseSteps says what releasing does to a record's steps.
const ReleaseSteps = "Its steps' journal goes with it: every step runs again, those already done included."

// CompleteQuestion asks to complete an uncertain record with an answer.
const CompleteQuestion = "Complete this uncertain record? Only if the operation did take effect: retries get the answer given here."

// CompleteSteps says what completing does to a record's steps.
const CompleteSteps = "The handler never runs again for this key: its steps not done never run."

// ResolveStepQuestion asks to settle step: done with the result that
// result describes (e.g. "the result below (24 bytes)"), or not done.
func ResolveStepQuestion(step string, done bool, result string) string {
	if !done {
		return fmt.Sprintf("Mark step %s NOT done? Only if its effect did not happen: the handler runs it again when it resumes.", step)
	}
	return fmt.Sprintf("Mark step %s done with %s? Only if its effect happened: the handler resumes after it with this result.", step, result)
}

// ResolveStepSteps says what resolving a step does to the record.
const ResolveStepSteps = "The steps done stay done; the record is in progress with its lease lapsed, and the next retry (or a recoverer) resumes the handler."
