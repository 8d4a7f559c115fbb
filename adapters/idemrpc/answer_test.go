package idemrpc_test

import (
	"testing"

	"github.com/idemkit/idem/adapters/idemrpc"
	idem "github.com/idemkit/idem/core"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
)

// TestEveryOutcomeMapped fails when core gains an outcome this table does
// not map: every outcome gets a code other than Unknown, its own reason,
// and a retry decision that is the outcome's.
func TestEveryOutcomeMapped(t *testing.T) {
	want := map[idem.Outcome]uint32{
		idem.OutcomeInProgress:         idemrpc.Aborted,
		idem.OutcomeUncertain:          idemrpc.FailedPrecondition,
		idem.OutcomeKeyExpired:         idemrpc.FailedPrecondition,
		idem.OutcomeReplayForbidden:    idemrpc.PermissionDenied,
		idem.OutcomeFingerprintChanged: idemrpc.FailedPrecondition,
		idem.OutcomeKeyReused:          idemrpc.FailedPrecondition,
		idem.OutcomeUnavailable:        idemrpc.Unavailable,
	}
	reasons := map[string]idem.Outcome{}
	for _, o := range idem.Outcomes() {
		resp := idem.Problem{Type: o.ProblemType(), Status: o.Status()}.Response()
		if o.Retryable() {
			resp.Header.Set("Retry-After", "3")
		}
		st, retryAfter := idemrpc.Answer(resp, "idempotency-key", "metadata", []string{"k"})
		code := uint32(st.GetCode())
		if code == idemrpc.Unknown || code != idemrpc.Code(o) {
			t.Errorf("%s: code %d, Code says %d", o, code, idemrpc.Code(o))
		}
		if w, ok := want[o]; ok && code != w {
			t.Errorf("%s: code %d, want %d", o, code, w)
		}
		if st.GetMessage() == "" {
			t.Errorf("%s: no message", o)
		}
		var details []any
		var info *errdetails.ErrorInfo
		for _, a := range st.GetDetails() {
			m, err := a.UnmarshalNew()
			if err != nil {
				t.Fatal(err)
			}
			details = append(details, m)
			if ei, ok := m.(*errdetails.ErrorInfo); ok {
				info = ei
			}
		}
		if info == nil || info.GetDomain() != idemrpc.ErrorDomain || info.GetReason() != idemrpc.Reason(o) || idemrpc.OutcomeOfReason(info.GetReason()) != o {
			t.Errorf("%s: ErrorInfo %v", o, info)
		}
		if prev, dup := reasons[idemrpc.Reason(o)]; dup {
			t.Errorf("%s and %s share reason %s", o, prev, idemrpc.Reason(o))
		}
		reasons[idemrpc.Reason(o)] = o
		delay, retry, got := idemrpc.Retry(code, details)
		if retry != o.Retryable() || got != o {
			t.Errorf("%s: Retry = %v (outcome %s), want %v", o, retry, got, o.Retryable())
		}
		if (retryAfter > 0) != o.Retryable() || retry && delay != retryAfter {
			t.Errorf("%s: RetryInfo %v, decoded %v", o, retryAfter, delay)
		}
	}
	// An application's own Aborted: retried only with RetryInfo.
	if _, retry, _ := idemrpc.Retry(idemrpc.Aborted, nil); retry {
		t.Error("an Aborted without RetryInfo is retried")
	}
	if _, retry, _ := idemrpc.Retry(idemrpc.Unavailable, nil); !retry {
		t.Error("Unavailable is not retried")
	}
}
