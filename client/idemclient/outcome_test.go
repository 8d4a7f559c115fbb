package idemclient_test

import (
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/idemkit/idem/client/idemclient"
	idem "github.com/idemkit/idem/core"
)

// asResponse are the outcomes a Transport returns as the server's
// response: errors about the request itself, and the executed-once answer.
var asResponse = map[idem.Outcome]bool{
	idem.OutcomeKeyMissing: true, idem.OutcomeKeyMalformed: true, idem.OutcomeNoPrincipal: true,
	idem.OutcomeBodyUnreadable: true, idem.OutcomeBodyTooLarge: true, idem.OutcomeResponseNotStored: true,
	idem.OutcomeRecoveryRefused: true, // a client never sends Idem-Recovery: an error about the request itself
}

// TestEveryOutcomeDecided fails when core gains an outcome the client does
// not decide: each of idem's answers, as the engine writes it, is retried
// (in-progress, store-unavailable), returned as the response, or returned
// at once as an *OutcomeError, never retried.
func TestEveryOutcomeDecided(t *testing.T) {
	for _, o := range idem.Outcomes() {
		t.Run(o.String(), func(t *testing.T) {
			s := newScript(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n > 0 {
					w.WriteHeader(201)
					return
				}
				resp := idem.Problem{Type: o.ProblemType(), Title: "t", Status: o.Status(), Detail: "d"}.Response()
				if o.Retryable() {
					resp.Header.Set("Retry-After", "0")
				}
				resp.Send(w)
			})
			cl := client(fast()...)
			defer closeIdle(cl)
			resp, err := post(t, cl, s.srv.URL, "x")
			sent := len(s.requests())
			var oe *idemclient.OutcomeError
			switch {
			case o.Retryable():
				if err != nil || resp.StatusCode != 201 || sent != 2 {
					t.Fatalf("err %v, %d requests; want a retry answered 201", err, sent)
				}
			case asResponse[o]:
				if err != nil || resp.StatusCode != o.Status() || sent != 1 {
					t.Fatalf("err %v, %d requests; want the %d response, not retried", err, sent, o.Status())
				}
			case errors.As(err, &oe):
				if oe.Outcome != o || oe.Attempts != 1 || oe.StatusCode != o.Status() || oe.Detail != "d" || sent != 1 {
					t.Fatalf("%+v after %d requests", oe, sent)
				}
			default:
				t.Fatalf("outcome %s not decided: err %v, %d requests", o, err, sent)
			}
			if resp != nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
}

// TestOutcomeErrors: each final outcome matches its own error and core's.
func TestOutcomeErrors(t *testing.T) {
	for o, want := range map[idem.Outcome][]error{
		idem.OutcomeUncertain:          {idemclient.ErrUncertain, idem.ErrUncertain},
		idem.OutcomeKeyExpired:         {idemclient.ErrKeyExpired, idem.ErrKeyExpired},
		idem.OutcomeReplayForbidden:    {idemclient.ErrReplayForbidden},
		idem.OutcomeKeyReused:          {idemclient.ErrKeyReused, idem.ErrMismatch},
		idem.OutcomeFingerprintChanged: {idemclient.ErrFingerprintChanged},
		idem.OutcomeUnreadable:         {idemclient.ErrStoredResultUnreadable, idem.ErrCorrupt},
	} {
		err := error(&idemclient.OutcomeError{Key: "k", Attempts: 1, StatusCode: o.Status(), Outcome: o})
		for _, w := range want {
			if !errors.Is(err, w) {
				t.Errorf("%s: %v does not match %v", o, err, w)
			}
		}
		if errors.Is(err, idemclient.ErrAttemptsExhausted) {
			t.Errorf("%s matches ErrAttemptsExhausted", o)
		}
	}
}
