package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	idem "github.com/idemkit/idem/core"
)

// A retry that re-serialises its JSON with another member order and a new
// sent_at is the same request under JSONFingerprintExcluding("/sent_at").
func ExampleJSONFingerprintExcluding() {
	f := idem.JSONFingerprintExcluding("/sent_at")
	first := f.Fingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"amount":1000,"sent_at":"10:00:00"}`))
	retry := f.Fingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"sent_at":"10:00:05", "amount":1000}`))
	other := f.Fingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"amount":2000,"sent_at":"10:00:00"}`))
	id, _, _ := strings.Cut(first, ":")
	fmt.Println(first == retry, first == other, id == f.ID())
	// Output: true false true
}

// WithReplayCheck re-authorizes the caller before a stored outcome is
// revealed; a refusal answers 403 "replay-forbidden".
func ExampleWithReplayCheck() {
	revoked := map[string]bool{"mallory": true} // your permission store
	_ = idem.WithReplayCheck(func(_ context.Context, info idem.ReplayInfo) error {
		if revoked[info.Principal] {
			return errors.New("permission revoked")
		}
		return nil
	})
	// Pass the option to idem.New(store, ...).
}
