package main

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines, except what fasthttp and Fiber v2
// never stop: fasthttp's date updater and idle worker-pool sleepers, the
// built-in idempotency middleware's memory storage (its GC loop and clock).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/gofiber/fiber/v2/internal/storage/memory.(*Storage).gc"),
		goleak.IgnoreAnyFunction("github.com/gofiber/fiber/v2/internal/storage/memory.New.StartTimeStampUpdater.func1.1"),
		goleak.IgnoreAnyFunction("github.com/gofiber/fiber/v2/utils.StartTimeStampUpdater.func1.1")) // the same clock, when not inlined
}

// TestServices serves every service of a load run in process on a loopback
// socket and attacks it with 4 workers for 300 requests of the mix: no
// errors, and idem and every peer execute each fresh key exactly once
// (duplicates and replays never), while the service without idempotency
// executes the duplicates and replays again (the ledger's count works).
func TestServices(t *testing.T) {
	for _, s := range services {
		t.Run(s.String(), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv, err := serve(context.Background(), s, ln)
			if err != nil {
				ln.Close()
				t.Fatal(err)
			}
			defer func() {
				if err := srv.shutdown(); err != nil {
					t.Error(err)
				}
			}()
			before, err := getStats(srv.url)
			if err != nil {
				t.Fatal(err)
			}
			r := attack(srv.url, 4, time.Minute, 300)
			after, err := getStats(srv.url)
			if err != nil {
				t.Fatal(err)
			}
			r.executions, r.keysTwice = after.Executions-before.Executions, after.KeysTwice-before.KeysTwice
			t.Log(r.line(s.String()), sortedCodes(r.codes))
			if r.requests != 300 || r.errors != 0 {
				t.Fatalf("%d requests, %d errors (first: %s), statuses %s", r.requests, r.errors, r.firstError, sortedCodes(r.codes))
			}
			if r.duplicates == 0 || r.replays == 0 {
				t.Fatalf("the mix sent %d duplicates and %d replays", r.duplicates, r.replays)
			}
			if s.lib == "none" {
				if r.executions != int64(r.requests) || r.keysTwice == 0 {
					t.Errorf("without idempotency: %d executions of %d requests, %d keys executed twice", r.executions, r.requests, r.keysTwice)
				}
				return
			}
			if r.executions != int64(r.fresh) || r.keysTwice != 0 {
				t.Errorf("%d executions for %d fresh keys, %d keys executed twice", r.executions, r.fresh, r.keysTwice)
			}
		})
	}
}
