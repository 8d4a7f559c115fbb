package benchmarks

import (
	"bytes"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idempotencyv2 "github.com/gofiber/fiber/v2/middleware/idempotency"
	idempotencyv3 "github.com/gofiber/fiber/v3/middleware/idempotency"
	redisstorage "github.com/gofiber/storage/redis/v3"
	"github.com/valyala/fasthttp"

	idem "github.com/idemkit/idem/core"
)

var executionsOut = flag.String("peers.out", "", "append TestPeersExecutions' counts to this file as benchmark lines (make bench)")

// Concurrent duplicates of TestPeersExecutions: dupKeys keys, each sent by
// dupCopies goroutines released together.
const (
	dupKeys   = 50
	dupCopies = 20
)

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
func concurrentDo(t *testing.T, d driver) func(key string) int {
	switch d := d.(type) {
	case *httpDriver:
		return func(key string) int {
			r := httptest.NewRequest(http.MethodPost, route, bytes.NewReader(reqBody))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("X-User-Id", principal)
			r.Header.Set(idem.DefaultHeader, key)
			w := httptest.NewRecorder()
			d.h.ServeHTTP(w, r)
			return w.Code
		}
	case *fiberDriver:
		return func(key string) int {
			ctx := new(fasthttp.RequestCtx)
			ctx.Init(new(fasthttp.Request), nil, nil)
			ctx.Request.Header.SetMethod(http.MethodPost)
			ctx.Request.SetRequestURI(route)
			ctx.Request.SetBody(reqBody)
			ctx.Request.Header.Set("Content-Type", "application/json")
			ctx.Request.Header.Set("X-User-Id", principal)
			ctx.Request.Header.Set(idem.DefaultHeader, key)
			d.h(ctx)
			return ctx.Response.StatusCode()
		}
	}
	t.Fatalf("no concurrent driver for %T", d)
	return nil
}

// dupResult is what one library did with the concurrent duplicates.
type dupResult struct {
	executions, keysTwice, maxPerKey, missing int
	status                                    map[int]int
}

// duplicates sends dupCopies concurrent copies of each of dupKeys fresh
// keys (all dupKeys*dupCopies goroutines released together), spread round
// robin over the instances' request functions, and counts the handler's
// executions per key.
func duplicates(dos []func(key string) int) dupResult {
	counts := new(sync.Map)
	keyCounts.Store(counts)
	defer keyCounts.Store(nil)
	keys := make([]string, dupKeys)
	for i := range keys {
		keys[i] = newKey()
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	res := dupResult{status: map[int]int{}}
	for _, k := range keys {
		for i := range dupCopies {
			do := dos[i%len(dos)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				code := do(k)
				mu.Lock()
				res.status[code]++
				mu.Unlock()
			}()
		}
	}
	close(start)
	wg.Wait()
	for _, k := range keys {
		n := int64(0)
		if v, ok := counts.Load(k); ok {
			n = v.(*atomic.Int64).Load()
		}
		res.executions += int(n)
		res.maxPerKey = max(res.maxPerKey, int(n))
		switch {
		case n == 0:
			res.missing++
		case n > 1:
			res.keysTwice++
		}
	}
	return res
}

// TestPeersExecutions sends 20 concurrent duplicates of each of 50 keys
// through idem and every peer (memory and Redis stores; with Redis also
// spread over two instances sharing it) and counts the handler's
// executions per key. idem must execute every key exactly once and answer
// every duplicate 201 (replayed) or 409 (in progress); the peers' counts
// are recorded (logged, and appended to -peers.out for RESULTS.md), not
// asserted: a peer that executes a key twice is a finding about that peer.
// Each execution lasts execDelay so that duplicates overlap it.
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
	if *executionsOut != "" {
		f, err := os.OpenFile(*executionsOut, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(strings.Join(lines, "\n") + "\n"); err != nil {
			t.Fatal(err)
		}
	}
}

// checkDuplicates runs duplicates on n instances of l, checks idem's
// counts and returns the benchmark line of the result.
func checkDuplicates(t *testing.T, l library, n int, name string) string {
	var dos []func(string) int
	for _, d := range l.build(t, n) {
		dos = append(dos, concurrentDo(t, d))
	}
	res := duplicates(dos)
	codes := make([]int, 0, len(res.status))
	for c := range res.status {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	var st strings.Builder
	for _, c := range codes {
		fmt.Fprintf(&st, " %d status-%d", res.status[c], c)
	}
	line := fmt.Sprintf("BenchmarkExecutions/%s 1 %d requests %d keys %d executions %d keys-executed-twice %d max-executions/key%s",
		name, dupKeys*dupCopies, dupKeys, res.executions, res.keysTwice, res.maxPerKey, st.String())
	t.Log(line)
	if res.missing > 0 {
		t.Errorf("%d of %d keys never executed: the harness lost requests (statuses %v)", res.missing, dupKeys, res.status)
	}
	if l.idem {
		if res.keysTwice > 0 {
			t.Errorf("idem executed %d of %d keys more than once (max %d)", res.keysTwice, dupKeys, res.maxPerKey)
		}
		for code, n := range res.status {
			if code != http.StatusCreated && code != http.StatusConflict {
				t.Errorf("idem answered %d duplicates %s", n, statusText(code))
			}
		}
	}
	return line
}
