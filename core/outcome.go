package idem

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

// Outcome names one of the engine's own answers: every way a request with
// an idempotency key ends other than running the handler or replaying its
// stored response. It is the one table every door (net/http adapters,
// gRPC, Connect, idemclient, the message consumers) maps from, so that an
// answer is told apart by what happened, not by the HTTP status it shares
// with another (409 is both in-progress and operation-uncertain). A door
// iterates [Outcomes] in a test so that an outcome added here cannot go
// unmapped.
//
// String is the problem type's fragment (the README's behaviour table);
// [Outcome.Status] the HTTP status; [Outcome.Retryable] whether a client
// may send the same request again with the same key.
type Outcome uint8

// The engine's answers. The zero Outcome, OutcomeNone, is none of them: an
// application's own response or error.
const (
	OutcomeNone               Outcome = iota // not one of the engine's answers
	OutcomeInProgress                        // 409 "in-progress", Retry-After: another execution holds the key ([ErrInProgress])
	OutcomeKeyReused                         // 422 "key-reused": the key was used with another fingerprint ([ErrMismatch])
	OutcomeFingerprintChanged                // 422 "fingerprint-changed": the key's record was fingerprinted by a function this engine does not know
	OutcomeUncertain                         // 409 "operation-uncertain", no Retry-After: the holder crashed mid-execution ([ErrUncertain], [WithUncertainAfterCrash])
	OutcomeKeyExpired                        // 410 "key-expired": the key was used, its result is no longer stored ([ErrKeyExpired], [WithTombstones])
	OutcomeReplayForbidden                   // 403 "replay-forbidden": the [WithReplayCheck] function refused
	OutcomeUnavailable                       // 503 "store-unavailable", Retry-After: nothing was executed ([ErrUnavailable])
	OutcomeUnreadable                        // 500 "stored-result-unreadable": the key's record does not decode ([ErrCorrupt])
	OutcomeResponseNotStored                 // 410 "response-not-stored": executed once, response too large to store ([ErrResultNotStored])
	OutcomeKeyMissing                        // 400 "key-missing" ([ErrKeyMissing])
	OutcomeKeyMalformed                      // 400 "key-malformed" ([ErrKeyMalformed], [ErrKeyTooLong], [ErrKeyConflict], or refused by [WithKeyValidator])
	OutcomeNoPrincipal                       // 401 "no-principal": no caller to scope the key by
	OutcomeBodyUnreadable                    // 400 "body-unreadable": the request body could not be read completely
	OutcomeBodyTooLarge                      // 413 "body-too-large": above [WithMaxBodyBytes] (or [MaxRecoveryBytes] on a recoverable route); nothing was executed
	OutcomeRecoveryRefused                   // 403 "recovery-refused": the request carried an Idem-Recovery header no pending recovery run issued ([RecoveryHeader]); nothing was executed
	outcomeCount
)

// outcomeTable is the one table: problem type fragment and HTTP status per
// outcome, and whether the same request may be sent again with its key.
var outcomeTable = [outcomeCount]struct {
	slug      string
	status    int
	retryable bool
}{
	OutcomeNone:               {"", 0, false},
	OutcomeInProgress:         {"in-progress", http.StatusConflict, true},
	OutcomeKeyReused:          {"key-reused", http.StatusUnprocessableEntity, false},
	OutcomeFingerprintChanged: {"fingerprint-changed", http.StatusUnprocessableEntity, false},
	OutcomeUncertain:          {"operation-uncertain", http.StatusConflict, false},
	OutcomeKeyExpired:         {"key-expired", http.StatusGone, false},
	OutcomeReplayForbidden:    {"replay-forbidden", http.StatusForbidden, false},
	OutcomeUnavailable:        {"store-unavailable", http.StatusServiceUnavailable, true},
	OutcomeUnreadable:         {"stored-result-unreadable", http.StatusInternalServerError, false},
	OutcomeResponseNotStored:  {"response-not-stored", http.StatusGone, false},
	OutcomeKeyMissing:         {"key-missing", http.StatusBadRequest, false},
	OutcomeKeyMalformed:       {"key-malformed", http.StatusBadRequest, false},
	OutcomeNoPrincipal:        {"no-principal", http.StatusUnauthorized, false},
	OutcomeBodyUnreadable:     {"body-unreadable", http.StatusBadRequest, false},
	OutcomeBodyTooLarge:       {"body-too-large", http.StatusRequestEntityTooLarge, false},
	OutcomeRecoveryRefused:    {"recovery-refused", http.StatusForbidden, false},
}

// Outcomes returns every outcome but OutcomeNone, in declaration order: the
// list a door's exhaustiveness test iterates.
func Outcomes() []Outcome {
	os := make([]Outcome, 0, outcomeCount-1)
	for o := OutcomeNone + 1; o < outcomeCount; o++ {
		os = append(os, o)
	}
	return os
}

// String returns the fragment of the outcome's problem type, e.g.
// "operation-uncertain"; "" for OutcomeNone and unknown values.
func (o Outcome) String() string {
	if o < outcomeCount {
		return outcomeTable[o].slug
	}
	return ""
}

// ProblemType returns the outcome's RFC 9457 problem type:
// [ProblemTypeBase] + String(); "" for OutcomeNone.
func (o Outcome) ProblemType() string {
	if s := o.String(); s != "" {
		return ProblemTypeBase + s
	}
	return ""
}

// Status returns the HTTP status the engine answers the outcome with; 0
// for OutcomeNone.
func (o Outcome) Status() int {
	if o < outcomeCount {
		return outcomeTable[o].status
	}
	return 0
}

// Retryable reports whether a client may send the same request again with
// the same idempotency key and expect another answer: true for
// OutcomeInProgress and OutcomeUnavailable only. Every other outcome is
// final for that key; OutcomeUncertain in particular must not be retried
// automatically (an operator resolves it, cmd/idemctl).
func (o Outcome) Retryable() bool { return o < outcomeCount && outcomeTable[o].retryable }

// ConsumerAction is what a message consumer (adapters/idemnats,
// adapters/idemamqp) does with a message whose [Do] ended with an outcome
// ([Outcome.ConsumerAction]), so that every consumer decides alike.
type ConsumerAction uint8

// The consumer actions.
const (
	// ConsumerRedeliver: nothing was decided for good (in progress
	// elsewhere, store unavailable, the function's transient error):
	// redeliver after a delay.
	ConsumerRedeliver ConsumerAction = iota + 1
	// ConsumerAck: the message was processed once already (key-expired:
	// only its tombstone is left; response-not-stored): acknowledge it,
	// never run it again.
	ConsumerAck
	// ConsumerPark: it may or may not have taken effect, or its record is
	// unreadable (operation-uncertain, stored-result-unreadable): set it
	// aside where an operator sees it (terminate, dead-letter) with the
	// record's key ([Operation.RecordKey]) logged, never cycle it through
	// redeliveries.
	ConsumerPark
	// ConsumerDrop: it can never run (key reused with another payload, a
	// malformed key, and the answers Do never gives): terminate or reject
	// it.
	ConsumerDrop
)

// ConsumerAction returns what a message consumer does with a message
// whose Do ended with o; OutcomeNone (the function's own transient error)
// is ConsumerRedeliver. A [Permanent] error is the consumer's to handle
// first (it has OutcomeNone).
func (o Outcome) ConsumerAction() ConsumerAction {
	switch o {
	case OutcomeNone, OutcomeInProgress, OutcomeUnavailable:
		return ConsumerRedeliver
	case OutcomeKeyExpired, OutcomeResponseNotStored:
		return ConsumerAck
	case OutcomeUncertain, OutcomeUnreadable:
		return ConsumerPark
	case OutcomeKeyReused, OutcomeFingerprintChanged, OutcomeReplayForbidden, OutcomeKeyMissing,
		OutcomeKeyMalformed, OutcomeNoPrincipal, OutcomeBodyUnreadable, OutcomeBodyTooLarge, OutcomeRecoveryRefused:
		return ConsumerDrop
	}
	return 0
}

// Err returns the error [Do] returns for the outcome, nil for outcomes Do
// never has (it has no principal, body, replay check or fingerprint
// function): ErrInProgress, ErrMismatch, ErrUncertain, ErrKeyExpired,
// ErrUnavailable, ErrCorrupt, ErrResultNotStored, ErrKeyMissing,
// ErrKeyMalformed.
func (o Outcome) Err() error {
	switch o {
	case OutcomeInProgress:
		return ErrInProgress
	case OutcomeKeyReused:
		return ErrMismatch
	case OutcomeUncertain:
		return ErrUncertain
	case OutcomeKeyExpired:
		return ErrKeyExpired
	case OutcomeUnavailable:
		return ErrUnavailable
	case OutcomeUnreadable:
		return ErrCorrupt
	case OutcomeResponseNotStored:
		return ErrResultNotStored
	case OutcomeKeyMissing:
		return ErrKeyMissing
	case OutcomeKeyMalformed:
		return ErrKeyMalformed
	}
	return nil
}

// OutcomeOfType returns the outcome whose problem type is t (a problem's
// "type" member), or OutcomeNone.
func OutcomeOfType(t string) Outcome {
	slug, ok := strings.CutPrefix(t, ProblemTypeBase)
	if !ok || slug == "" {
		return OutcomeNone
	}
	for o := OutcomeNone + 1; o < outcomeCount; o++ {
		if outcomeTable[o].slug == slug {
			return o
		}
	}
	return OutcomeNone
}

// OutcomeOf returns the outcome resp answers: the engine's problems carry
// it whatever [WithProblemRenderer] made of their body; any other response
// (a replay, a decoded record) is read by its RFC 9457 body's "type" when
// its Content-Type is application/problem+json (a replayed
// "response-not-stored"). OutcomeNone for nil and for the application's
// own responses.
func OutcomeOf(resp *Response) Outcome {
	if resp == nil {
		return OutcomeNone
	}
	if resp.outcome != OutcomeNone {
		return resp.outcome
	}
	var ct string
	resp.EachHeader(func(name, value string) {
		if ct == "" && strings.EqualFold(name, "Content-Type") {
			ct = value
		}
	})
	if !strings.HasPrefix(ct, "application/problem+json") {
		return OutcomeNone
	}
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(resp.Body, &p) != nil {
		return OutcomeNone
	}
	return OutcomeOfType(p.Type)
}

// OutcomeOfError returns the outcome an error of [Do] reports (by
// errors.Is, so wrapped errors and errors matching a sentinel, such as a
// step's uncertainty matching ErrUncertain, count), or OutcomeNone for the
// function's own errors, a [StoredError] and nil.
func OutcomeOfError(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeNone
	case errors.Is(err, ErrUncertain):
		return OutcomeUncertain
	case errors.Is(err, ErrKeyExpired):
		return OutcomeKeyExpired
	case errors.Is(err, ErrInProgress):
		return OutcomeInProgress
	case errors.Is(err, ErrMismatch):
		return OutcomeKeyReused
	case errors.Is(err, ErrUnavailable):
		return OutcomeUnavailable
	case errors.Is(err, ErrCorrupt):
		return OutcomeUnreadable
	case errors.Is(err, ErrResultNotStored):
		return OutcomeResponseNotStored
	case errors.Is(err, ErrKeyMissing):
		return OutcomeKeyMissing
	case errors.Is(err, ErrKeyMalformed), errors.Is(err, ErrKeyTooLong), errors.Is(err, ErrKeyConflict):
		return OutcomeKeyMalformed
	}
	return OutcomeNone
}

// RecordKey returns the scoped key of op's record ([ScopedKey] over its
// scope, the method "(do)", its name and key): the KEY cmd/idemctl takes
// to show, resolve or evict it.
func (op Operation) RecordKey() string { return ScopedKey(op.Scope, doMethod, op.Name, op.Key) }
