package idem

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// TestOutcomeTable checks that every fixed answer of the engine carries its
// outcome (rendered as RFC 9457 or by a custom renderer), that every
// outcome is one of those answers, and that the table's columns agree with
// the answers.
func TestOutcomeTable(t *testing.T) {
	for _, render := range []func(Problem) (string, []byte){nil, func(p Problem) (string, []byte) { return "text/plain", []byte(p.Title) }} {
		ps := newProblems(time.Second, render)
		answered := map[Outcome]bool{}
		v := reflect.ValueOf(ps)
		for i := range v.NumField() {
			f := v.Field(i)
			if f.Type() != reflect.TypeFor[*Response]() {
				continue
			}
			r := (*Response)(f.UnsafePointer())
			o := OutcomeOf(r)
			if o == OutcomeNone {
				t.Errorf("problems.%s answers no outcome", v.Type().Field(i).Name)
				continue
			}
			if r.Status != o.Status() {
				t.Errorf("problems.%s: status %d, outcome %s says %d", v.Type().Field(i).Name, r.Status, o, o.Status())
			}
			answered[o] = true
		}
		answered[OutcomeOf(ps.refusedKey(errors.New("no")))] = true
		answered[OutcomeOf(ps.inProgressFor(7))] = true
		rec, err := DecodeResponse(ps.notStored(201, ""))
		if err != nil {
			t.Fatal(err)
		}
		if render == nil {
			answered[OutcomeOf(rec)] = true
		} else {
			answered[OutcomeResponseNotStored] = true // a custom rendering is read by no one
		}
		for _, o := range Outcomes() {
			if !answered[o] {
				t.Errorf("outcome %s (%d) is not one of the engine's answers", o, o)
			}
			if OutcomeOfType(o.ProblemType()) != o {
				t.Errorf("OutcomeOfType(%q) = %s", o.ProblemType(), OutcomeOfType(o.ProblemType()))
			}
			if o.ConsumerAction() == 0 {
				t.Errorf("outcome %s has no consumer action", o)
			}
			if e := o.Err(); e != nil && OutcomeOfError(fmt.Errorf("wrapped: %w", e)) != o {
				t.Errorf("OutcomeOfError(%v) = %s, want %s", e, OutcomeOfError(e), o)
			}
		}
	}
	if OutcomeOf(&Response{Status: 409}) != OutcomeNone || OutcomeOf(nil) != OutcomeNone || OutcomeOfType("about:blank") != OutcomeNone {
		t.Error("an application's response has an outcome")
	}
	for o, want := range map[Outcome]bool{OutcomeInProgress: true, OutcomeUnavailable: true, OutcomeUncertain: false, OutcomeKeyExpired: false, OutcomeReplayForbidden: false, OutcomeFingerprintChanged: false, OutcomeKeyReused: false} {
		if o.Retryable() != want {
			t.Errorf("%s.Retryable() = %v", o, !want)
		}
	}
	for o, want := range map[Outcome]ConsumerAction{OutcomeNone: ConsumerRedeliver, OutcomeInProgress: ConsumerRedeliver,
		OutcomeUncertain: ConsumerPark, OutcomeKeyExpired: ConsumerAck, OutcomeKeyReused: ConsumerDrop} {
		if o.ConsumerAction() != want {
			t.Errorf("%s.ConsumerAction() = %d, want %d", o, o.ConsumerAction(), want)
		}
	}
	if OutcomeOfError(errors.New("app")) != OutcomeNone || OutcomeOfError(&StoredError{Message: "x"}) != OutcomeNone {
		t.Error("an application's error has an outcome")
	}
	if got := (Operation{Scope: "s", Name: "n", Key: "k"}).RecordKey(); got != ScopedKey("s", doMethod, "n", "k") {
		t.Errorf("RecordKey = %s", got)
	}
}
