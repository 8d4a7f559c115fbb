package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// TestUncertain is the operator's story under idem.WithUncertainAfterCrash,
// on every shared store: a process crashed mid-charge, so its record is
// uncertain and retries get 409 operation-uncertain; `list -state
// uncertain` finds it; `complete` stores the answer the operator learned
// (retries replay it), `release` frees another one (the retry executes);
// neither touches a record that is not uncertain.
func TestUncertain(t *testing.T) {
	for name, newBackend := range backends {
		t.Run(name, func(t *testing.T) { testUncertain(t, newBackend(t)) })
	}
}

func testUncertain(t *testing.T, b testStore) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k, ok := b.store.(idem.Keeper)
	if !ok {
		t.Fatalf("%T does not implement idem.Keeper", b.store)
	}
	engine, err := idem.New(b.store, idem.WithUncertainAfterCrash(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = engine.Close(ctx) }()
	body := []byte(`{"amount":1000}`)
	request := func(key string) *idem.Request {
		return &idem.Request{Method: "POST", Route: "/v1/payments", Path: "/v1/payments", ContentType: "application/json",
			Keys: []string{key}, Principal: "acct_1", Body: body}
	}
	fp := idem.Fingerprint("POST", "/v1/payments", "", "application/json", body)
	// crashed leaves the record of a process that died mid-charge.
	crashed := func() (idemKey, scoped string) {
		idemKey = "pay-" + randomHex(8)
		scoped = idem.ScopedKey("acct_1", "POST", "/v1/payments", idemKey)
		if _, ok, err := k.AcquireKeep(ctx, scoped, "crashed-instance.17", fp, 300*time.Millisecond, idem.Keep{Uncertain: time.Hour}); err != nil || !ok {
			t.Fatalf("AcquireKeep for the crashed process = %v, %v", ok, err)
		}
		return idemKey, scoped
	}
	charged, chargedScoped := crashed()
	refunded, refundedScoped := crashed()
	time.Sleep(500 * time.Millisecond) // both leases lapse

	x, resp := engine.Begin(ctx, request(charged))
	if x != nil || resp == nil || resp.Status != http.StatusConflict || !strings.Contains(string(resp.Body), "operation-uncertain") {
		t.Fatalf("retry of an uncertain key: execution %v, answer %+v; want 409 operation-uncertain", x != nil, resp)
	}
	out, _ := listAll(ctx, t, b, "-state", "uncertain")
	for _, key := range []string{chargedScoped, refundedScoped} {
		if !strings.Contains(out, key+"  uncertain") || !strings.Contains(out, "owner crashed-instance.17") {
			t.Fatalf("list -state uncertain:\n%s\nwant %s", out, key)
		}
	}
	if code, out, errOut := ctl(ctx, t, b, "", "show", chargedScoped[:16]); code != exitOK || !strings.Contains(out, "state        uncertain") {
		t.Fatalf("show = %d\n%s%s", code, out, errOut)
	}

	// The provider says the charge went through: store its answer.
	receipt := `{"id":"pay_1","status":"succeeded"}`
	code, out, errOut := ctl(ctx, t, b, receipt, "complete", "-status", "201", "-file", "-", "-header", "Content-Type: application/json", chargedScoped[:16])
	if code != exitOK || !strings.Contains(out, "completed: retries get 201") {
		t.Fatalf("complete = %d\n%s%s", code, out, errOut)
	}
	x, resp = engine.Begin(ctx, request(charged))
	contentType := ""
	if resp != nil {
		resp.EachHeader(func(k, v string) {
			if k == "Content-Type" {
				contentType = v
			}
		})
	}
	if x != nil || resp == nil || resp.Status != http.StatusCreated || string(resp.Body) != receipt || contentType != "application/json" {
		t.Fatalf("retry after complete: execution %v, answer %+v; want the replay of the stored answer", x != nil, resp)
	}
	// Neither command touches a record that is not uncertain.
	for _, cmd := range [][]string{{"release", "-yes"}, {"complete", "-status", "200"}} {
		if code, out, _ := ctl(ctx, t, b, "", append(cmd, chargedScoped)...); code != exitFail || !strings.Contains(out, "not resolved: the record is completed") {
			t.Fatalf("%v of a completed record = %d\n%s", cmd, code, out)
		}
	}

	// The provider says the other charge never happened: release it.
	if code, out, _ := ctl(ctx, t, b, "n\n", "release", refundedScoped); code != exitFail || !strings.Contains(out, "not released") {
		t.Fatalf("release answered no = %d\n%s", code, out)
	}
	if code, out, errOut := ctl(ctx, t, b, "y\n", "release", refundedScoped); code != exitOK || !strings.Contains(out, "released: the next request with this key executes") {
		t.Fatalf("release = %d\n%s%s", code, out, errOut)
	}
	x, resp = engine.Begin(ctx, request(refunded))
	if x == nil {
		t.Fatalf("retry after release was not executed: %+v", resp)
	}
	x.Finish(http.StatusCreated, nil)

	if code, _, errOut := ctl(ctx, t, b, "", "complete", "-status", "42", refundedScoped); code != exitUsage || !strings.Contains(errOut, "-status") {
		t.Fatalf("complete -status 42 = %d\n%s", code, errOut)
	}
}
