// Command report turns the output of `go test -bench` for the benchmarks
// module into RESULTS.md and its charts: today's numbers first (one line
// per question), the machine, one table per question, the targets and how
// to reproduce them. benchstat's output and the base-revision comparison
// stay in their files under results/, which RESULTS.md links; notes on
// earlier passes live in results/history.md, never in RESULTS.md.
//
//	go run ./cmd/report -in results/bench.txt -benchstat results/benchstat.txt -md RESULTS.md -png overhead.png
//
// Every ratio it prints comes from samples of the same run (the medians of
// the -count samples of each benchmark). Targets are reported as met or
// missed with the measured value; nothing here fails on a missed target.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	in := flag.String("in", "bench.txt", "go test -bench output; several files separated by commas (TestPeersExecutions' -peers.out, cmd/load's output)")
	bstat := flag.String("benchstat", "", "benchstat output files RESULTS.md links, separated by commas (paths relative to RESULTS.md)")
	compare := flag.String("compare", "", "benchstat output of scripts/bench.sh compare (results/compare.txt: a base revision against the working tree, in turns on one machine), which RESULTS.md links; optional")
	md := flag.String("md", "RESULTS.md", "markdown file to write")
	png := flag.String("png", "overhead.png", "chart to write")
	loadPNG := flag.String("loadpng", "load.png", "chart of the load benchmark to write, if its results are in -in")
	flag.Parse()

	var r *results
	for _, name := range strings.Split(*in, ",") {
		f, err := os.Open(name)
		if err != nil {
			log.Fatal(err)
		}
		fr, err := parse(f)
		f.Close()
		if err != nil {
			log.Fatal(err)
		}
		r = r.merge(fr)
	}
	loadChartName = filepath.Base(*loadPNG)
	var stats []string
	for _, name := range strings.Split(*bstat, ",") {
		if name != "" {
			stats = append(stats, name)
		}
	}
	var cmp *results
	if *compare != "" {
		f, err := os.Open(*compare)
		if err != nil {
			log.Fatal(err)
		}
		cmp, err = parse(f) // its compare-* header lines
		f.Close()
		if err != nil {
			log.Fatal(err)
		}
	}
	out, err := os.Create(*md)
	if err != nil {
		log.Fatal(err)
	}
	w := bufio.NewWriter(out)
	writeReport(w, r, stats, *compare, cmp)
	if err := w.Flush(); err != nil {
		log.Fatal(err)
	}
	if err := out.Close(); err != nil {
		log.Fatal(err)
	}
	if err := chart(r, *png); err != nil {
		log.Fatal(err)
	}
	if err := loadChart(r, *loadPNG); err != nil {
		log.Fatal(err)
	}
}

// loadChartName is the load chart's file name as RESULTS.md links it.
var loadChartName string

// results holds every sample of a benchmark run.
type results struct {
	config map[string]string
	keys   []string                        // config keys in order of appearance
	by     map[string]map[string][]float64 // benchmark name -> unit -> samples
}

var (
	benchLine  = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$`)
	configLine = regexp.MustCompile(`^([a-z][a-zA-Z0-9_-]*):\s*(.*)$`)
)

func parse(rd io.Reader) (*results, error) {
	r := &results{config: map[string]string{}, by: map[string]map[string][]float64{}}
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := benchLine.FindStringSubmatch(line); m != nil {
			fields := strings.Fields(m[3])
			units := r.by[m[1]]
			if units == nil {
				units = map[string][]float64{}
				r.by[m[1]] = units
			}
			for i := 0; i+1 < len(fields); i += 2 {
				v, err := strconv.ParseFloat(fields[i], 64)
				if err != nil {
					continue
				}
				units[fields[i+1]] = append(units[fields[i+1]], v)
			}
			continue
		}
		if m := configLine.FindStringSubmatch(line); m != nil && m[1] != "ok" && m[1] != "pkg" {
			if _, ok := r.config[m[1]]; !ok {
				r.keys = append(r.keys, m[1])
			}
			r.config[m[1]] = m[2] // the last value wins (e.g. load at the end)
		}
	}
	return r, sc.Err()
}

// merge adds o's configuration and benchmarks to r (nil: o itself); a
// benchmark o has replaces r's samples of it, so that a later run of some
// benchmarks (scripts/bench.sh peers) is never mixed with an earlier one.
func (r *results) merge(o *results) *results {
	if r == nil {
		return o
	}
	for _, k := range o.keys {
		if _, ok := r.config[k]; !ok {
			r.keys = append(r.keys, k)
		}
		r.config[k] = o.config[k]
	}
	maps.Copy(r.by, o.by)
	return r
}

// get returns the median of name's samples in unit.
func (r *results) get(name, unit string) (float64, bool) {
	s := r.by[name][unit]
	if len(s) == 0 {
		return 0, false
	}
	s = slices.Clone(s)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2], true
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2, true
}

func (r *results) ns(name string) (float64, bool) { return r.get(name, "ns/op") }

// span returns the smallest and largest sample of name in unit (the
// per-round range of a median), ok false when there is none.
func (r *results) span(name, unit string) (lo, hi float64, ok bool) {
	s := r.by[name][unit]
	if len(s) == 0 {
		return 0, 0, false
	}
	return slices.Min(s), slices.Max(s), true
}

// sum returns the sum of the samples of name in unit (every round's), ok
// false when there is none.
func (r *results) sum(name, unit string) (float64, bool) {
	s := r.by[name][unit]
	t := 0.0
	for _, v := range s {
		t += v
	}
	return t, len(s) > 0
}

// dur formats nanoseconds for a table.
func dur(ns float64) string {
	switch {
	case ns >= 1e9:
		return fmt.Sprintf("%.2f s", ns/1e9)
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.2f µs", ns/1e3)
	}
	return fmt.Sprintf("%.0f ns", ns)
}

func num(v float64) string {
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func bytesStr(v float64) string {
	switch {
	case v >= 1<<20:
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.1f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}

const na = "–"

// target is one measured target. Targets of one group (the same target
// per framework or per store) share one line of the targets table, item
// naming each one's case.
type target struct {
	what, measured string
	met            bool
	known          bool
	group, item    string
}

var frameworks = []string{"nethttp", "gin", "echo", "echov5", "fiber", "fiberv3"}

// peer is a framework's own idempotency middleware idem is compared with:
// builtin measures it alone, paired alternates it with idem (benchmarks
// BenchmarkMiddleware/fw=<fw>).
type peer struct{ fw, label, pkg, builtin, paired string }

var peers = []peer{
	{fw: "fiber", label: "Fiber v2", pkg: "github.com/gofiber/fiber/v2/middleware/idempotency", builtin: "BenchmarkFiberBuiltin", paired: "BenchmarkFiberPeer"},
	{fw: "fiberv3", label: "Fiber v3", pkg: "github.com/gofiber/fiber/v3/middleware/idempotency", builtin: "BenchmarkFiberV3Builtin", paired: "BenchmarkFiberV3Peer"},
}

func writeReport(out io.Writer, r *results, stats []string, cmpFile string, cmp *results) {
	var targets []target
	var body bytes.Buffer // every section; written after today's numbers
	w := &body
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }

	p("## Machine\n\n| | |\n|---|---|\n")
	for _, k := range r.keys {
		if strings.HasPrefix(k, "loadrun-") || strings.HasPrefix(k, "peers-") || strings.HasPrefix(k, "go-peers-") { // sections 9 and 2b say theirs
			continue
		}
		p("| %s | %s |\n", k, r.config[k])
	}
	p("\nThe machine is shared: other processes (tests, fuzzers of the same repository) may run at the same time; the load averages above bracket the run. Absolute numbers move with that load, ratios much less.\n\n")

	// 1. Middleware
	p("## %s\n\n", hMiddleware)
	p("One op is one request through the router (`httptest.NewRecorder` + `ServeHTTP`; Fiber v2 and v3: `app.Handler()` on a reused `*fasthttp.RequestCtx`), handler reading the body and answering 201 with a 67-byte JSON body. ")
	p("*bare*: no idem; *fresh*: first execution of a new key each op (records accumulate in the store: a fixed op count keeps that equal across cases); *replay*: the same completed key; *conflict*: a key held in progress (409); *passthrough*: GET with idem mounted, compared with *bare GET*.\n\n")
	p("| framework | bare | fresh (×bare) | replay (×bare) | conflict (×bare) | bare GET | passthrough (×bare GET) |\n|---|---|---|---|---|---|---|\n")
	for _, fw := range frameworks {
		base := "BenchmarkMiddleware/fw=" + fw + "/path="
		bare, ok := r.ns(base + "bare")
		if !ok {
			continue
		}
		cell := func(path string, ref float64) string {
			v, ok := r.ns(base + path)
			if !ok {
				return na
			}
			return fmt.Sprintf("%s (%.2f×)", dur(v), v/ref)
		}
		bget, _ := r.ns(base + "bare-get")
		p("| %s | %s | %s | %s | %s | %s | %s |\n", fw, dur(bare), cell("fresh", bare), cell("replay", bare), cell("conflict", bare), dur(bget), cell("passthrough", bget))
	}
	p("\nOverhead over bare (time and allocations added by idem per request):\n\n")
	p("| framework | fresh Δns | fresh Δallocs | fresh ΔB | replay Δns | replay Δallocs | conflict Δns | passthrough Δns |\n|---|---|---|---|---|---|---|---|\n")
	for _, fw := range frameworks {
		base := "BenchmarkMiddleware/fw=" + fw + "/path="
		bare, ok := r.ns(base + "bare")
		if !ok {
			continue
		}
		bareA, _ := r.get(base+"bare", "allocs/op")
		bareB, _ := r.get(base+"bare", "B/op")
		fresh, _ := r.ns(base + "fresh")
		freshA, _ := r.get(base+"fresh", "allocs/op")
		freshB, _ := r.get(base+"fresh", "B/op")
		replay, _ := r.ns(base + "replay")
		replayA, _ := r.get(base+"replay", "allocs/op")
		conflict, _ := r.ns(base + "conflict")
		bget, _ := r.ns(base + "bare-get")
		pass, _ := r.ns(base + "passthrough")
		p("| %s | %s | %s | %s | %s | %s | %s | %s |\n", fw, dur(fresh-bare), num(freshA-bareA), bytesStr(freshB-bareB), dur(replay-bare), num(replayA-bareA), dur(conflict-bare), dur(pass-bget))
		targets = append(targets,
			target{group: "memory-store overhead on the fresh path < 2 µs", item: fw, measured: dur(fresh - bare), met: fresh-bare < 2000, known: true},
			target{group: "fresh path adds < 20 allocations", item: fw, measured: num(freshA - bareA), met: freshA-bareA < 20, known: true},
			target{group: "replay cheaper than fresh (replay ÷ fresh < 1)", item: fw, measured: fmt.Sprintf("%.2f×", replay/fresh), met: replay < fresh, known: true},
		)
	}

	// 2. Fiber peers
	p("\n## %s\n\n", hFiber)
	p("`middleware/idempotency` of Fiber v2 and of Fiber v3, each with its default in-memory storage and lock (header set to `Idempotency-Key`), on the same app as idem on that Fiber, same 36-character UUID-shaped keys. Neither scopes keys by principal or route nor fingerprints requests, answers anything like 409/422; both make concurrent duplicates wait on a process-local lock; idem does all of that. Ratio = idem ÷ Fiber built-in (< 1.0: idem faster).\n\n")
	p("*separate* compares the medians of BenchmarkMiddleware/fw=<fiber> and the built-in's benchmark; *paired* alternates the two in chunks of 500 requests inside one benchmark, so both see the same machine load: the paired ratio is the headline.\n\n")
	p("| peer | scenario | idem on Fiber | Fiber built-in | idem ÷ built-in (separate) | paired: idem / built-in per request | **paired ratio** | allocs idem / built-in |\n|---|---|---|---|---|---|---|---|\n")
	for _, pe := range peers {
		for _, path := range []string{"fresh", "replay"} {
			ours, ok1 := r.ns("BenchmarkMiddleware/fw=" + pe.fw + "/path=" + path)
			theirs, ok2 := r.ns(pe.builtin + "/path=" + path)
			if !ok1 || !ok2 {
				continue
			}
			oa, _ := r.get("BenchmarkMiddleware/fw="+pe.fw+"/path="+path, "allocs/op")
			ta, _ := r.get(pe.builtin+"/path="+path, "allocs/op")
			ratio := ours / theirs
			pairedCell, ratioCell := na, na
			pn := pe.paired + "/path=" + path
			if pr, ok := r.get(pn, "idem/builtin"); ok {
				pi, _ := r.get(pn, "idem-ns/op")
				pb, _ := r.get(pn, "builtin-ns/op")
				pairedCell = dur(pi) + " / " + dur(pb)
				ratioCell = fmt.Sprintf("**%.2f**", pr)
				ratio = pr
			}
			p("| %s (`%s`) | %s | %s | %s | %.2f | %s | %s | %s / %s |\n", pe.label, pe.pkg, path, dur(ours), dur(theirs), ours/theirs, pairedCell, ratioCell, num(oa), num(ta))
			limit := map[string]float64{"fresh": 1.0, "replay": 1.2}[path] // issue #15's targets
			targets = append(targets, target{what: fmt.Sprintf("%s: idem ÷ %s's built-in middleware ≤ %.1f (paired)", path, pe.label, limit), measured: fmt.Sprintf("%.2f×", ratio), met: ratio <= limit, known: true})
		}
	}

	writePeers(w, r)

	// 3. Stores
	p("\n## %s\n\n", hStores)
	if v, ok := r.config["mongo-server"]; ok {
		p("The `mongo` rows ran against: **%s**, not a MongoDB server; its latencies say little about MongoDB's.\n\n", v)
	}
	p("Shared store benchmarks (store API directly; `hot-key` and `parallel-distinct` use `b.RunParallel`, GOMAXPROCS goroutines). Round trips are counted from the commands the client sent (go-redis hook, MongoDB command monitor, writes of each pgx and MySQL connection).\n\n")
	p("| store | op | time/op | allocs/op | round trips/op |\n|---|---|---|---|---|\n")
	for _, st := range []string{"memory", "redis", "mongo", "postgres", "mysql"} {
		for _, op := range []string{"acquire-complete", "replay", "hot-key", "parallel-distinct"} {
			name := "BenchmarkStore/store=" + st + "/op=" + op
			v, ok := r.ns(name)
			if !ok {
				continue
			}
			a, _ := r.get(name, "allocs/op")
			rt, ok := r.get(name, "roundtrips/op")
			rts := na
			if ok {
				rts = num(rt)
			}
			p("| %s | %s | %s | %s | %s |\n", st, op, dur(v), num(a), rts)
		}
	}
	p("\nThrough the engine (`Begin`, `Write`, `Finish`, no framework), next to the floor of round trips:\n\n")
	p("| store | path | time/op | allocs/op | round trips/op | floor |\n|---|---|---|---|---|---|\n")
	floors := map[string]float64{"fresh": 2, "replay": 1, "conflict": 1}
	for _, st := range []string{"memory", "redis", "mongo", "postgres", "mysql"} {
		for _, path := range []string{"fresh", "replay", "conflict"} {
			name := "BenchmarkEngine/store=" + st + "/path=" + path
			v, ok := r.ns(name)
			if !ok {
				continue
			}
			a, _ := r.get(name, "allocs/op")
			rt, ok := r.get(name, "roundtrips/op")
			rts := na
			if ok {
				rts = num(rt)
				targets = append(targets, target{group: "round trips at the floor (fresh 2, replay 1, conflict 1)", item: st + " " + path, measured: num(rt), met: rt <= floors[path]+0.01, known: true})
			}
			p("| %s | %s | %s | %s | %s | %v |\n", st, path, dur(v), num(a), rts, floors[path])
		}
	}

	// 4. Redis floor
	p("\n## %s\n\n", hRedisFloor)
	idemNs, ok1 := r.ns("BenchmarkRedisFloor/impl=idem")
	bareNs, ok2 := r.ns("BenchmarkRedisFloor/impl=bare-go-redis")
	if ok1 && ok2 {
		p("Fresh idempotent requests through the engine on redisstore (a `SET NX GET` and a Lua script run) against a bare go-redis client sending two plain commands of the same size (`SET NX PX` of a token, `SET XX PX` of the encoded response), both with `b.RunParallel` at the same concurrency (`SetParallelism(8)`: 16 goroutines), one client each, Redis on the same 2 cores.\n\n")
		p("| | time/op | requests/s | allocs/op | round trips/op |\n|---|---|---|---|---|\n")
		for _, row := range []struct{ label, name string }{{"idem (redisstore)", "BenchmarkRedisFloor/impl=idem"}, {"bare go-redis", "BenchmarkRedisFloor/impl=bare-go-redis"}} {
			v, _ := r.ns(row.name)
			a, _ := r.get(row.name, "allocs/op")
			rt, _ := r.get(row.name, "roundtrips/op")
			p("| %s | %s | %.0f | %s | %s |\n", row.label, dur(v), 1e9/v, num(a), num(rt))
		}
		ratio := bareNs / idemNs
		p("\nThroughput ratio idem ÷ bare, separate benchmarks = %.2f.\n", ratio)
		if pr, ok := r.get("BenchmarkRedisFloor/impl=paired", "idem/bare"); ok {
			pi, _ := r.get("BenchmarkRedisFloor/impl=paired", "idem-ns/op")
			pb, _ := r.get("BenchmarkRedisFloor/impl=paired", "bare-ns/op")
			ratio = 1 / pr
			p("Paired (`impl=paired`: the two alternate in chunks of 500 requests over the same 16 goroutines, so both see the same load): idem %s, bare %s per request: throughput ratio idem ÷ bare = **%.2f** (the headline).\n", dur(pi), dur(pb), ratio)
		}
		targets = append(targets, target{what: "Redis fresh throughput ≥ 0.9× the bare two-command floor", measured: fmt.Sprintf("%.2f×", ratio), met: ratio >= 0.9, known: true})
	}

	// 4b. PostgreSQL floor
	if idemNs, ok := r.ns("BenchmarkPostgresFloor/impl=idem"); ok {
		if bareNs, ok := r.ns("BenchmarkPostgresFloor/impl=bare-pgx"); ok {
			p("\n### %s\n\n", hPGFloor)
			p("Fresh idempotent requests through the engine on pgstore (acquire `INSERT … ON CONFLICT` with its CTE, conditional completion `UPDATE`) against a bare pgx pool sending two plain statements on a table of the same shape (`INSERT` of a token with its lease, `UPDATE` of the encoded response by primary key), both with `b.RunParallel` at `SetParallelism(8)`, one pool each, PostgreSQL on the same 2 cores.\n\n")
			p("| | time/op | requests/s | allocs/op | round trips/op |\n|---|---|---|---|---|\n")
			for _, row := range []struct{ label, name string }{{"idem (pgstore)", "BenchmarkPostgresFloor/impl=idem"}, {"bare pgx", "BenchmarkPostgresFloor/impl=bare-pgx"}} {
				v, _ := r.ns(row.name)
				a, _ := r.get(row.name, "allocs/op")
				rt, _ := r.get(row.name, "roundtrips/op")
				p("| %s | %s | %.0f | %s | %s |\n", row.label, dur(v), 1e9/v, num(a), num(rt))
			}
			ratio := bareNs / idemNs
			p("\nThroughput ratio idem ÷ bare, separate benchmarks = %.2f.\n", ratio)
			if pr, ok := r.get("BenchmarkPostgresFloor/impl=paired", "idem/bare"); ok {
				pi, _ := r.get("BenchmarkPostgresFloor/impl=paired", "idem-ns/op")
				pb, _ := r.get("BenchmarkPostgresFloor/impl=paired", "bare-ns/op")
				ratio = 1 / pr
				p("Paired (alternating chunks over the same goroutines): idem %s, bare %s per request: throughput ratio idem ÷ bare = **%.2f**.\n", dur(pi), dur(pb), ratio)
			}
			targets = append(targets, target{what: "PostgreSQL fresh throughput ≥ 0.9× the bare two-statement floor", measured: fmt.Sprintf("%.2f×", ratio), met: ratio >= 0.9, known: true})
		}
	}

	// 4c. MySQL floor
	if idemNs, ok := r.ns("BenchmarkMySQLFloor/impl=idem"); ok {
		if bareNs, ok := r.ns("BenchmarkMySQLFloor/impl=bare-sql"); ok {
			p("\n### %s\n\n", hMySQLFloor)
			p("Fresh idempotent requests through the engine on mysqlstore (the acquire procedure's `CALL`, conditional completion `UPDATE`) against a bare `*sql.DB` sending two plain prepared statements on a table of the same shape (`INSERT` of a token with its lease, `UPDATE` of the encoded response by primary key), both with `b.RunParallel` at `SetParallelism(8)`, one `*sql.DB` each, the server on the same 2 cores.\n\n")
			p("| | time/op | requests/s | allocs/op | round trips/op |\n|---|---|---|---|---|\n")
			for _, row := range []struct{ label, name string }{{"idem (mysqlstore)", "BenchmarkMySQLFloor/impl=idem"}, {"bare database/sql", "BenchmarkMySQLFloor/impl=bare-sql"}} {
				v, _ := r.ns(row.name)
				a, _ := r.get(row.name, "allocs/op")
				rt, _ := r.get(row.name, "roundtrips/op")
				p("| %s | %s | %.0f | %s | %s |\n", row.label, dur(v), 1e9/v, num(a), num(rt))
			}
			ratio := bareNs / idemNs
			p("\nThroughput ratio idem ÷ bare, separate benchmarks = %.2f.\n", ratio)
			if pr, ok := r.get("BenchmarkMySQLFloor/impl=paired", "idem/bare"); ok {
				pi, _ := r.get("BenchmarkMySQLFloor/impl=paired", "idem-ns/op")
				pb, _ := r.get("BenchmarkMySQLFloor/impl=paired", "bare-ns/op")
				ratio = 1 / pr
				p("Paired (alternating chunks over the same goroutines): idem %s, bare %s per request: throughput ratio idem ÷ bare = **%.2f**.\n", dur(pi), dur(pb), ratio)
			}
			targets = append(targets, target{what: "MySQL fresh throughput ≥ 0.9× the bare two-statement floor", measured: fmt.Sprintf("%.2f×", ratio), met: ratio >= 0.9, known: true})
		}
	}

	// 5. Scale
	p("\n## %s\n\n", hScale)
	p("Acquire+complete on a memstore preloaded with n live records (200-byte body). The measured keys rotate through 1,024 expired slots on a fake clock, so the store holds n+1,024 records however long the benchmark runs. Bytes per record from `runtime.MemStats.HeapAlloc` (after GC) around the preload.\n\n")
	p("| live records | time/op | × at 10^3 | allocs/op | bytes/record |\n|---|---|---|---|---|\n")
	small, okSmall := r.ns("BenchmarkMemScale/records=1000")
	for _, n := range []string{"1000", "100000", "1000000"} {
		name := "BenchmarkMemScale/records=" + n
		v, ok := r.ns(name)
		if !ok {
			continue
		}
		a, _ := r.get(name, "allocs/op")
		br, _ := r.get(name, "B/record")
		rel := na
		if okSmall {
			rel = fmt.Sprintf("%.2f×", v/small)
		}
		p("| %s | %s | %s | %s | %.0f B |\n", n, dur(v), rel, num(a), br)
	}
	if big, ok := r.ns("BenchmarkMemScale/records=1000000"); ok && okSmall {
		targets = append(targets, target{what: "memstore acquire+complete at 10^6 records ≤ 1.3× at 10^3", measured: fmt.Sprintf("%.2f×", big/small), met: big/small <= 1.3, known: true})
	}
	if base, ok := r.get("BenchmarkMemRetention", "heap-base-B"); ok {
		loaded, _ := r.get("BenchmarkMemRetention", "heap-loaded-B")
		after, _ := r.get("BenchmarkMemRetention", "heap-after-B")
		n, _ := r.get("BenchmarkMemRetention", "records")
		p("\nRetention: %s records completed (1 h retention, fake clock), clock moved 2 h, `Cleanup()`, GC:\n\n", num(n))
		p("| heap before | heap loaded | heap after cleanup | after ÷ before |\n|---|---|---|---|\n| %s | %s | %s | %.2f× |\n", bytesStr(base), bytesStr(loaded), bytesStr(after), after/base)
		targets = append(targets, target{what: "memstore heap back to baseline after retention (≤ 1.1×)", measured: fmt.Sprintf("%.2f×", after/base), met: after/base <= 1.1, known: true})
	}
	if v, ok := r.get("BenchmarkRedisRecordSize", "B/record"); ok {
		g, _ := r.get("BenchmarkRedisRecordSize", "used_memory-B/record")
		p("\nRedis, 1,000 completed records with a 200-byte body: `MEMORY USAGE` %.0f B/record; `INFO used_memory` grew %.0f B/record.\n", v, g)
	}

	// 6. Contention
	p("\n## %s\n\n", hContention)
	p("1,000 goroutines released together call `Engine.Begin` with the same key; the one that acquires holds its execution until every other has its answer, then finishes. *all answered* runs from the release to the last answer.\n\n")
	p("| store | all answered | 409 p50 | 409 p99 | executions per storm |\n|---|---|---|---|---|\n")
	for _, st := range []string{"memory", "redis"} {
		name := "BenchmarkContention/store=" + st
		all, ok := r.get(name, "all-answered-ns")
		if !ok {
			continue
		}
		p50, _ := r.get(name, "p50-409-ns")
		p99, _ := r.get(name, "p99-409-ns")
		ex, _ := r.get(name, "executions/op")
		p("| %s | %s | %s | %s | %s |\n", st, dur(all), dur(p50), dur(p99), num(ex))
		targets = append(targets, target{group: "exactly 1 execution per storm of 1,000 duplicates", item: st, measured: num(ex), met: ex == 1, known: true})
	}

	// 7. E2E
	p("\n## %s\n\n", hE2E)
	p("`examples/<fw>` built with `go build`, run as a process with `-charge-latency 0`; vegeta (library, max rate, 16 connections, keep-alive) on the same 2 cores POSTs `/v1/payments`. *fresh*: a new key per request (custom Targeter); *replay*: one key, executed once before the attack. *no-idem* is the same service with `-no-idem`. The load generator and the service share the 2 cores, one case after the other for a second or two each: ratios within about ±20%% of 1.0 are noise here; the Redis rows (an extra process on the same cores, two round trips per request) are not.\n\n")
	p("| framework | mode | traffic | requests/s | ÷ no-idem | p50 | p99 |\n|---|---|---|---|---|---|---|\n")
	for _, fw := range frameworks {
		for _, mode := range []string{"no-idem", "idem-memory", "idem-redis"} {
			for _, traffic := range []string{"fresh", "replay"} {
				name := "BenchmarkE2E/fw=" + fw + "/mode=" + mode + "/traffic=" + traffic
				rps, ok := r.get(name, "req/s")
				if !ok {
					continue
				}
				base, _ := r.get("BenchmarkE2E/fw="+fw+"/mode=no-idem/traffic="+traffic, "req/s")
				p50, _ := r.get(name, "p50-ns")
				p99, _ := r.get(name, "p99-ns")
				rel := na
				if base > 0 {
					rel = fmt.Sprintf("%.2f", rps/base)
				}
				p("| %s | %s | %s | %.0f | %s | %s | %s |\n", fw, mode, traffic, rps, rel, dur(p50), dur(p99))
			}
		}
	}

	// 8. Instances
	if _, ok := r.get("BenchmarkInstances/instances=1", "req/s"); ok {
		p("\n## %s\n\n", hInstances)
		p("n in-process instances (net/http + idemhttp, each its own engine and go-redis client, each its own loopback HTTP server) share one Redis; 16 client goroutines go round-robin over their addresses. A logical request is a fresh key POSTed to one instance and its retry POSTed to the next (a replay). Medians of 3 runs. **Every instance, the clients and Redis share the same 2 cores**: the total is bounded by the CPU, so adding instances here cannot add capacity; what the table shows is that coordinating more instances through Redis costs little (executions per logical request stay exactly 1).\n\n")
		p("| instances | HTTP req/s (all) | req/s per instance | × total at 1 | executions per logical request |\n|---|---|---|---|---|\n")
		one, _ := r.get("BenchmarkInstances/instances=1", "req/s")
		for _, n := range []string{"1", "2", "4", "8"} {
			name := "BenchmarkInstances/instances=" + n
			rps, ok := r.get(name, "req/s")
			if !ok {
				continue
			}
			per, _ := r.get(name, "req/s/instance")
			ex, _ := r.get(name, "executions/logical")
			p("| %s | %.0f | %.0f | %.2f× | %s |\n", n, rps, per, rps/one, num(ex))
		}
	}

	writeLoad(w, r, loadChartName)
	writeHistory(w, r, &targets)
	writeSoak(w, r, &targets)

	writeTargets(w, targets)
	p("\n![per-framework overhead and per-store latency](overhead.png)\n")

	p("\n## How to reproduce\n\n")
	p("```sh\nmake bench            # starts Redis and the FerretDB test server if needed; about 5–10 minutes on 2 cores; writes this file\n")
	p("make bench-load       # section 9 only (about 5 minutes), after make bench\n")
	p("make bench-peers      # sections 2 and 2b's pairs only (-count 6, benchstat) and the execution counts (scripts/bench.sh peers)\n")
	p("make bench-compare BASE=<rev>  # nothing slower: the benchmarks at <rev> and at the working tree in turns, benchstat into results/compare.txt\n")
	p("# or one part, e.g.:\ncd benchmarks && go test -run '^$' -bench 'Middleware|Fiber.*Builtin|Fiber.*Peer' -benchtime=100000x -count=5 .\n")
	p("go test -run '^$' -bench 'Middleware/fw=gin/path=fresh' -benchtime=100000x -cpuprofile cpu.out -memprofile mem.out . && go tool pprof -top cpu.out\n```\n\n")
	p("`make test` compiles every benchmark and runs each once (`-benchtime=1x`, without `-bench.full`: no 10^6 preload, no end-to-end processes).\n")

	p("\n## Raw output, comparisons and earlier runs\n\n")
	p("- `results/bench.txt` (and `executions.txt`, `load.txt`, `go-peers.txt`): this run's raw `go test -bench` output, from which every table above is computed.\n")
	for _, f := range stats {
		p("- [`%s`](%s): benchstat's summary (medians, confidence intervals).\n", f, f)
	}
	if cmp != nil {
		p("- [`%s`](%s): the benchmarks at base revision %s against the working tree, in turns on this machine (%s rounds, %s; `make bench-compare`): the rule that nothing gets slower.\n",
			cmpFile, cmpFile, cmp.config["compare-base"], cmp.config["compare-rounds"], cmp.config["compare-date"])
	}
	p("- [`results/history.md`](results/history.md): the passes that brought these numbers (profiles, what was changed, before → after) and superseded figures; `results/<pass>/` hold their raw runs.\n")
	p("- [`results/steps-outbox.md`](results/steps-outbox.md): durable steps (`BenchmarkSteps`: the cost of a step per store, paired with the same operation without steps) and the outbox relay's throughput and lag (`make soak`), measured outside `make bench`.\n")
	p("- [`results/proof.md`](results/proof.md): what the deterministic simulation, the journal and record models and the linearizability check cover per `make test` run (seeds, operations, contended operations), and where the mutation evidence is.\n")

	var tail bytes.Buffer
	fmt.Fprintf(&tail, "# idem benchmarks\n\n")
	fmt.Fprintf(&tail, "Today's numbers, from one run of `make bench` (%s, %s, Go %s; [machine](#machine)). Every ratio compares medians of samples taken in that same run; targets are reported as met or missed, never asserted. Each line links its table.\n\n",
		r.config["date"], r.config["machine"], strings.TrimPrefix(r.config["go"], "go"))
	writeHeadlines(&tail, r)
	if _, err := out.Write(tail.Bytes()); err != nil {
		return
	}
	_, _ = out.Write(body.Bytes())
}

// writeTargets writes the targets table: one line per target, or per
// group of targets (one per framework or store) with each case's value.
func writeTargets(w io.Writer, targets []target) {
	fmt.Fprintf(w, "\n## Targets\n\n| target | measured | |\n|---|---|---|\n")
	verdict := func(t target) string {
		switch {
		case !t.known:
			return "not measured"
		case t.met:
			return "met"
		}
		return "**missed**"
	}
	done := map[string]bool{}
	for _, t := range targets {
		if t.group == "" {
			fmt.Fprintf(w, "| %s | %s | %s |\n", t.what, t.measured, verdict(t))
			continue
		}
		if done[t.group] {
			continue
		}
		done[t.group] = true
		var cases []string
		met, n := 0, 0
		for _, g := range targets {
			if g.group != t.group {
				continue
			}
			n++
			c := g.item + " " + g.measured
			if g.met {
				met++
			} else {
				c = "**" + c + "**"
			}
			cases = append(cases, c)
		}
		v := "met"
		if met < n {
			v = fmt.Sprintf("**missed** (met by %d of %d)", met, n)
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", t.group, strings.Join(cases, ", "), v)
	}
}
