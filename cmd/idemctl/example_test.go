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

// Example_list shows the lines of `idemctl list`: a held lease, a lapsed
// one (its holder crashed) and a completed record.
func Example_list() {
	fp := idem.Fingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"amount":1000}`))
	printList(os.Stdout, []idem.ListedRecord{
		{Key: idem.ScopedKey("acct_1", "POST", "/v1/payments", "pay-1"), RecordInfo: idem.RecordInfo{
			Record: idem.Record{State: idem.StateInProgress, Token: "api-7.3f2a", Fingerprint: fp}, TTL: -42 * time.Second}},
		{Key: idem.ScopedKey("acct_1", "POST", "/v1/payments", "pay-2"), RecordInfo: idem.RecordInfo{
			Record: idem.Record{State: idem.StateInProgress, Token: "api-2.91cc", Fingerprint: fp}, TTL: 25 * time.Second}},
		{Key: idem.ScopedKey("acct_1", "POST", "/v1/payments", "pay-3"), RecordInfo: idem.RecordInfo{
			Record: idem.Record{State: idem.StateCompleted, Fingerprint: fp}, TTL: 23*time.Hour + 59*time.Minute}},
	})
	// Output:
	// 6e5b8a738606016f8575cc839341b627c31593ca1a38911c52994bebc72b5da7  in-progress  lease lapsed 42s ago: its holder stopped renewing, the next request executes, owner api-7.3f2a
	// 1f9d02fd0fc5f915a555313e67110e76eb0d26f40343236ea15b10787570c589  in-progress  lease held, 25s left: retries get 409 (stuck if its holder no longer runs), owner api-2.91cc
	// 30a861ae0e2538eaf5a65a01546cb4f5a6005a6d33625fc15591265a04a12e41  completed    expires in 23h59m0s
}
