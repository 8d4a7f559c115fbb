package main

import (
	"os"
	"time"

	idem "github.com/idemkit/idem/core"
)

// Example shows what `idemctl show` prints for a completed record.
func Example() {
	printRecord(os.Stdout, idem.RecordInfo{
		Record: idem.Record{
			State:       idem.StateCompleted,
			Fingerprint: idem.Fingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"amount":1000}`)),
			// The engine's encoding of a 201 with Content-Type, Location and a JSON body.
			Response: []byte("\x01\xc9\x01\x02\x0cContent-Type\x01\x10application/json\x08Location\x01\x12/v1/payments/pay_1" +
				`{"id":"pay_1"}`),
		},
		TTL: 23*time.Hour + 59*time.Minute + 58*time.Second,
	}, time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC))
	// Output:
	// state        completed
	// expires in   23h59m58s, at 2026-12-01T21:59:58Z (retention)
	// fingerprint  7f374ab949fb8ed0dfc2dc784992676b26864286d09a842fa51d0d8d4380dc38
	// status       201
	// header       Content-Type: application/json
	// header       Location: /v1/payments/pay_1
	// body         14 bytes
}
