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
	}, leaseView{idem.DefaultLease, idem.DefaultStoreTimeout}, time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC))
	// Output:
	// state        completed
	// expires in   23h59m58s, at 2026-12-01T21:59:58Z (retention)
	// fingerprint  7f374ab949fb8ed0dfc2dc784992676b26864286d09a842fa51d0d8d4380dc38
	// status       201
	// header       Content-Type: application/json
	// header       Location: /v1/payments/pay_1
	// body         14 bytes: {"id":"pay_1"}
}

// Example_inProgress shows what `idemctl show` prints for an in-progress
// record whose holder stopped renewing its lease: 12s left is below the
// 16s a renewing holder keeps under the default 30s lease.
func Example_inProgress() {
	printRecord(os.Stdout, idem.RecordInfo{
		Record: idem.Record{
			State:       idem.StateInProgress,
			Token:       "api-7:4242:T7KQ3MZLJ2XW5RVA.17",
			Fingerprint: idem.Fingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"amount":1000}`)),
		},
		TTL: 12 * time.Second,
	}, leaseView{idem.DefaultLease, idem.DefaultStoreTimeout}, time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC))
	// Output:
	// state        in-progress
	// expires in   12s, at 2026-11-30T22:00:12Z (lease: a handler that still runs renews it every lease/3)
	// lease owner  host api-7, pid 4242 (token api-7:4242:T7KQ3MZLJ2XW5RVA.17)
	// holder       stopped renewing (crashed, or its process stalls): 12s left is at most 16s, the least a renewing holder keeps (-lease 30s - lease/3 - 2 × -store-timeout 2s); the lease lapses in 12s, then the next request executes
	// fingerprint  7f374ab949fb8ed0dfc2dc784992676b26864286d09a842fa51d0d8d4380dc38
}

// Example_list shows the lines of `idemctl list`: a lapsed lease (its
// holder crashed), a lease its holder renews, one it stopped renewing,
// and a completed record.
func Example_list() {
	fp := idem.Fingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"amount":1000}`))
	printList(os.Stdout, []idem.ListedRecord{
		{Key: idem.ScopedKey("acct_1", "POST", "/v1/payments", "pay-1"), RecordInfo: idem.RecordInfo{
			Record: idem.Record{State: idem.StateInProgress, Token: "api-7:4242:T7KQ3MZLJ2XW5RVA.3", Fingerprint: fp}, TTL: -42 * time.Second}},
		{Key: idem.ScopedKey("acct_1", "POST", "/v1/payments", "pay-2"), RecordInfo: idem.RecordInfo{
			Record: idem.Record{State: idem.StateInProgress, Token: "api-2:977:Q2WNB5XKDPA4LMRZ.91", Fingerprint: fp}, TTL: 25 * time.Second}},
		{Key: idem.ScopedKey("acct_1", "POST", "/v1/payments", "pay-4"), RecordInfo: idem.RecordInfo{
			Record: idem.Record{State: idem.StateInProgress, Token: "api-2:977:Q2WNB5XKDPA4LMRZ.92", Fingerprint: fp}, TTL: 9 * time.Second}},
		{Key: idem.ScopedKey("acct_1", "POST", "/v1/payments", "pay-3"), RecordInfo: idem.RecordInfo{
			Record: idem.Record{State: idem.StateCompleted, Fingerprint: fp}, TTL: 23*time.Hour + 59*time.Minute}},
	}, leaseView{idem.DefaultLease, idem.DefaultStoreTimeout})
	// Output:
	// 6e5b8a738606016f8575cc839341b627c31593ca1a38911c52994bebc72b5da7  in-progress  lease lapsed 42s ago, due: its holder stopped renewing it (or an operator resolved a step); the next request with its key, or a recoverer, takes it over and resumes from its journal, owner host api-7, pid 4242 (token api-7:4242:T7KQ3MZLJ2XW5RVA.3)
	// 1f9d02fd0fc5f915a555313e67110e76eb0d26f40343236ea15b10787570c589  in-progress  lease held, 25s left, renewed or new (above 16s): retries get 409, owner host api-2, pid 977 (token api-2:977:Q2WNB5XKDPA4LMRZ.91)
	// 06b5c93a03d2e15ecfff95356b7ae04efb8c755a54f526a19546173efbf3dd0e  in-progress  lease held, 9s left, NOT renewed (at most 16s: its holder stopped): retries get 409 until it lapses, owner host api-2, pid 977 (token api-2:977:Q2WNB5XKDPA4LMRZ.92)
	// 30a861ae0e2538eaf5a65a01546cb4f5a6005a6d33625fc15591265a04a12e41  completed    expires in 23h59m0s
}
