package benchmarks

import (
	"flag"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	idempotencyv2 "github.com/gofiber/fiber/v2/middleware/idempotency"
	idempotencyv3 "github.com/gofiber/fiber/v3/middleware/idempotency"
	redisstorage "github.com/gofiber/storage/redis/v3"
	"github.com/valyala/fasthttp"

	"github.com/idemkit/idem/benchmarks/internal/harness"
	idem "github.com/idemkit/idem/core"
)

var executionsOut = flag.String("peers.out", "", "append TestPeersExecutions' counts to this file as benchmark lines (make bench)")

// library is one idempotency middleware with one store, mounted on one
// framework's app of BenchmarkMiddleware; build returns n apps (instances)
// sharing that store (n > 1 only for stores shared across processes).
type library struct {
	lib, fw, store string
	idem           bool // idem itself: must execute every key exactly once
	build          func(t *testing.T, n int) []driver
}

// libraries lists idem and every peer this module can build, each on the
// frameworks and stores it supports.
func libraries() []library {
	idemOn := func(fw string, open func(testing.TB) (idem.Store, *atomic.Int64)) func(*testing.T, int) []driver {
		return func(t *testing.T, n int) []driver {
			s, _ := open(t)
			var ds []driver
			for _, f := range frameworks {
				for f.name == fw && len(ds) < n {
					ds = append(ds, f.build(newEngine(t, s)))
				}
			}
			return ds
		}
	}
	local := func(build func() driver) func(*testing.T, int) []driver {
		return func(*testing.T, int) []driver { return []driver{build()} }
	}
	fiberRedis := func(t *testing.T, n int, app func(*redisstorage.Storage) driver) []driver {
		c, _, _ := newRedisClient(t)
		s := redisstorage.NewFromConnection(c)
		var ds []driver
		for range n {
			ds = append(ds, app(s))
		}
		return ds
	}
	var libs []library
	for _, fw := range []string{"nethttp", "gin", "fiber", "fiberv3"} {
		libs = append(libs,
			library{lib: "idem", fw: fw, store: "memory", idem: true, build: idemOn(fw, openMem)},
			library{lib: "idem", fw: fw, store: "redis", idem: true, build: idemOn(fw, openRedis)})
	}
	return append(libs,
		library{lib: "floor", fw: "nethttp", store: "memory", build: local(newNetHTTPFloor)},
		library{lib: "floor", fw: "gin", store: "memory", build: local(newGinFloor)},
		library{lib: "fiber-builtin", fw: "fiber", store: "memory", build: local(newFiberBuiltin)},
		library{lib: "fiber-builtin", fw: "fiber", store: "redis", build: func(t *testing.T, n int) []driver {
			return fiberRedis(t, n, func(s *redisstorage.Storage) driver {
				return newFiberDriver(newFiberApp(idempotencyv2.New(idempotencyv2.Config{KeyHeader: idem.DefaultHeader, Lifetime: 2 * time.Minute, Storage: s})))
			})
		}},
		library{lib: "fiberv3-builtin", fw: "fiberv3", store: "memory", build: local(newFiberV3Builtin)},
		library{lib: "fiberv3-builtin", fw: "fiberv3", store: "redis", build: func(t *testing.T, n int) []driver {
			return fiberRedis(t, n, func(s *redisstorage.Storage) driver {
				return newFasthttpDriver(newFiberV3App(idempotencyv3.New(idempotencyv3.Config{KeyHeader: idem.DefaultHeader, Lifetime: 2 * time.Minute, Storage: s})).Handler())
			})
		}},
	)
}

// concurrentDo returns a request function for d's app that goroutines may
// call at the same time (d.do reuses one request).
func concurrentDo(t *testing.T, d driver) func(key string) harness.Answer {
	switch d := d.(type) {
	case httpDriver:
		return harness.ConcurrentHTTP(d.H)
	case *fiberDriver:
		return func(key string) harness.Answer {
			ctx := new(fasthttp.RequestCtx)
			ctx.Init(new(fasthttp.Request), nil, nil)
			ctx.Request.Header.SetMethod(http.MethodPost)
			ctx.Request.SetRequestURI(route)
			ctx.Request.SetBody(reqBody)
			ctx.Request.Header.Set("Content-Type", "application/json")
			ctx.Request.Header.Set("X-User-Id", principal)
			ctx.Request.Header.Set(idem.DefaultHeader, key)
			d.h(ctx)
			return harness.Answer{Status: ctx.Response.StatusCode(), RetryAfter: string(ctx.Response.Header.Peek("Retry-After"))}
		}
	}
	t.Fatalf("no concurrent driver for %T", d)
	return nil
}

// TestPeersExecutions sends 20 concurrent duplicates of each of 50 keys
// through idem and every peer (memory and Redis stores; with Redis also
// spread over two instances sharing it) and counts the handler's
// executions per key. Each duplicate is a client retrying idem's
// retryable answers (503 store-unavailable and 409 in-progress, after
// their Retry-After, within harness.DupRetryBudget): on a loaded machine
// the store may not answer within its timeout, which is back-pressure, not
// a fault. idem must execute every key exactly once, first answer every
// duplicate 201 (replayed), 409 (in progress) or 503 (store unavailable),
// and end every client's retries with 201; the peers' counts are recorded
// (logged, and appended to -peers.out for RESULTS.md), not asserted: a
// peer that executes a key twice is a finding about that peer. Each
// execution lasts harness.ExecDelay so that duplicates overlap it.
func TestPeersExecutions(t *testing.T) {
	var lines []string
	for _, l := range libraries() {
		for _, n := range []int{1, 2} {
			if n > 1 && l.store == "memory" {
				continue // a memory store is one process's
			}
			name := fmt.Sprintf("lib=%s/fw=%s/store=%s/instances=%d", l.lib, l.fw, l.store, n)
			t.Run(name, func(t *testing.T) { lines = append(lines, checkDuplicates(t, l, n, name)) })
		}
	}
	if err := harness.AppendLines(*executionsOut, lines); err != nil {
		t.Fatal(err)
	}
}

// checkDuplicates runs duplicates on n instances of l, checks idem's
// counts and returns the benchmark line of the result.
func checkDuplicates(t *testing.T, l library, n int, name string) string {
	var dos []func(string) harness.Answer
	for _, d := range l.build(t, n) {
		dos = append(dos, concurrentDo(t, d))
	}
	res := harness.Duplicates(dos)
	line := res.Line(name)
	t.Log(line)
	if !l.idem {
		return line
	}
	if res.Missing > 0 {
		t.Errorf("%d of %d keys never executed although every client retried for up to %v (first answers %v, last %v)",
			res.Missing, harness.DupKeys, harness.DupRetryBudget, res.Status, res.Final)
	}
	if res.KeysTwice > 0 {
		t.Errorf("idem executed %d of %d keys more than once (max %d)", res.KeysTwice, harness.DupKeys, res.MaxPerKey)
	}
	for code, n := range res.Status {
		if code != http.StatusCreated && code != http.StatusConflict && code != http.StatusServiceUnavailable {
			t.Errorf("idem first answered %d duplicates %s", n, statusText(code))
		}
	}
	for code, n := range res.Final {
		if code != http.StatusCreated {
			t.Errorf("%d duplicates still answered %s after retrying for up to %v", n, statusText(code), harness.DupRetryBudget)
		}
	}
	return line
}
