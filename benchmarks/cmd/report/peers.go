package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// floorPeers are the paired benchmarks of idem against internal/floor.
var floorPeers = []struct{ fw, label, bench string }{
	{"nethttp", "net/http", "BenchmarkNetHTTPPeer"},
	{"gin", "Gin", "BenchmarkGinPeer"},
}

// writePeers writes the Go peers' section: what each cannot do, the paired
// floor on Gin and net/http, and the execution counts under concurrent
// duplicates.
func writePeers(w io.Writer, r *results) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("\n## %s\n\n", hGoPeers)
	if d := r.config["peers-date"]; d != "" {
		p("The paired ratios of sections 2 and 2b and the execution counts come from a later run of the peers alone (`scripts/bench.sh peers`: every pair -count 6, benchstat in `results/peers-benchstat.txt`), %s, machine load %s at the start and %s at the end; the separate medians of section 2 and the other sections from the run in the Machine table.\n\n", d, r.config["peers-load-start"], r.config["peers-load-end"])
	}
	p("The Go libraries a Gin or net/http team would otherwise pick: `github.com/fco-gt/gopotency` v1.0.0, `github.com/bright-room/idem` v1.2.1 (with its `gin` module) and `github.com/repenguin22/idemlease` v1.1.0 (with `ginadapter` and `redistore`). The Go module proxy refuses all three (403 \"not available\"), so this tree cannot require them: their figures below were measured once from their public source at those tags, in a harness outside this tree that used this module's app, handler, keys and pairing (`internal/harness`); this tree neither fetches nor builds their code, so no make target measures them again, and `benchmarks/results/go-peers.txt` is kept as the record of that run. What each cannot do, read from its code at that tag (each configured as close to idem as it allows; *here* says how it is configured below):\n\n")
	p("| | idem | fco-gt/gopotency | bright-room/idem | repenguin22/idemlease | Fiber v2/v3 built-in |\n|---|---|---|---|---|---|\n")
	p("| scope (principal, route) | principal + method + route, required | none: its middlewares take the raw `Idempotency-Key` header (a `KeyStrategy` is consulted only when the header is missing) | none | principal (`KeyScope`; here the same principal function as idem's), not route | none |\n")
	p("| fingerprint → 422 | method, path, query, media type, body | SHA-256 of the body only (default `RequestHasher`), compared with the stored record only | none: another payload under the same key is replayed | method, path, query, body | none: replayed |\n")
	p("| concurrent duplicate | 409 (or bounded wait) | 409, but `Check` reads the record before `Lock` takes the lock and nothing re-reads it: a duplicate that read before the first request locked and locks after it finished executes again (a narrow window: 0–2 of 50 keys in the in-process runs of `TestPeersExecutions` here) | waits for the key's lock (memory: a mutex per key, one goroutine per request to wait on it; Redis: `SET NX` polled every 50 ms, bounded only by the request context), then replays | 409 + Retry-After | waits on a process-local lock |\n")
	p("| lease separate from retention, renewed | yes | lock timeout (default 5 min; here idem's 30 s), not renewed | lock TTL = record TTL (default 24 h), not renewed: a crash holds the key that long | lease 30 s, not renewed | no stored lock |\n")
	p("| multi-instance lock | every shared store | Redis (`SET NX`), SQL | Redis | Redis (Lua), PostgreSQL | no (lock is in-process) |\n")
	p("| Redis commands, fresh / replay | 2 / 1 | 6 / 1 (`GET`, `SET NX` lock, `SET` pending, `GET`, `SET`, `DEL` lock) | 4 / 3 (`SET NX` lock, `GET`, `SET`, unlock script) | 2 / 1 (reserve and complete scripts) | 3 / 1 |\n")
	p("| Redis client | borrowed, any prefix | dials its own from address and password: database 0, no key prefix | borrowed, prefixes | borrowed, prefix | any `fiber.Storage` |\n")
	p("| stores | memory, Redis, PostgreSQL, MySQL, MongoDB | memory (a cleanup goroutine nothing stops; hands out the stored record, which completion then mutates: a data race), Redis, SQL, GORM | memory, Redis | memory, Redis, PostgreSQL | any `fiber.Storage` |\n")
	p("| frameworks | net/http, Gin, Echo v4/v5, Fiber v2/v3 | net/http, Gin, Echo, Fiber (its Fiber middleware keeps the key from `c.Get` and the body from `c.Body()`, which alias fasthttp buffers, in the record: with Fiber's default `Immutable: false` its memory storage loses keys to later requests, which then run again; section 9 counts them) | net/http, Gin (its `gin` module) | net/http, Gin, gRPC | Fiber only |\n\n")
	writeGoPeers(w, r)
	p("Beside them, idem on Gin and net/http is paired with **the floor** (`benchmarks/internal/floor`): the least work a correct in-process middleware does — the raw key looked up in a sharded map, 409 while the first request runs, status, Content-Type and body stored and replayed; no scope, no fingerprint, no lease, no key syntax check, no retention. No configuration of any peer above does less, so idem ÷ floor bounds what any of them could win. Same app, same 36-character keys, chunks of 500 requests alternating (as for Fiber in section 2).\n\n")
	p("| framework | path | paired: idem / floor per request | **idem ÷ floor** |\n|---|---|---|---|\n")
	for _, fp := range floorPeers {
		for _, path := range []string{"fresh", "replay"} {
			n := fp.bench + "/path=" + path
			ratio, ok := r.get(n, "idem/builtin")
			if !ok {
				continue
			}
			pi, _ := r.get(n, "idem-ns/op")
			pb, _ := r.get(n, "builtin-ns/op")
			p("| %s | %s | %s / %s | **%.2f** |\n", fp.label, path, dur(pi), dur(pb), ratio)
		}
	}
	redisPeers := []struct{ label, bench string }{
		{"Fiber v2", "BenchmarkFiberRedisPeer"},
		{"Fiber v3", "BenchmarkFiberV3RedisPeer"},
	}
	if _, ok := r.get(redisPeers[0].bench+"/path=fresh", "idem/builtin"); ok {
		p("\nWith Redis on Fiber: idem with redisstore against Fiber's built-in middleware with `gofiber/storage/redis` (its lock stays process-local), each its own client of the same Redis, paired the same way. The built-in sends three commands on a fresh request (`GET`, `GET` under its lock, `SET`), idem two; one each on a replay.\n\n")
		p("| framework | path | paired: idem / built-in per request | **idem ÷ built-in** |\n|---|---|---|---|\n")
		for _, rp := range redisPeers {
			for _, path := range []string{"fresh", "replay"} {
				n := rp.bench + "/path=" + path
				ratio, ok := r.get(n, "idem/builtin")
				if !ok {
					continue
				}
				pi, _ := r.get(n, "idem-ns/op")
				pb, _ := r.get(n, "builtin-ns/op")
				p("| %s | %s | %s / %s | **%.2f** |\n", rp.label, path, dur(pi), dur(pb), ratio)
			}
		}
	}
	writeExecutions(w, r)
}

// goPeers are the libraries of results/go-peers.txt, by the name in its
// benchmarks (peer=<name>, metric idem/<name>).
var goPeers = []struct{ name, label string }{
	{"gopotency", "fco-gt/gopotency"},
	{"brightroom", "bright-room/idem"},
	{"idemlease", "repenguin22/idemlease"},
}

// writeGoPeers writes the table of results/go-peers.txt: idem ÷ each Go peer,
// paired, fresh and replay, memory and Redis, with the peer's keys
// executed twice under concurrent duplicates.
func writeGoPeers(w io.Writer, r *results) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	if _, ok := r.get("BenchmarkPeers/fw=gin/peer=gopotency/path=fresh", "idem/gopotency"); !ok {
		p("*No figures of the Go peers* (`benchmarks/results/go-peers.txt` is missing).\n\n")
		return
	}
	p("**idem ÷ each Go peer, paired** (the record `results/go-peers.txt`, BenchmarkPeers and BenchmarkPeersRedis: the app, handler, requests and 36-character keys of section 1, idem and the peer alternating in chunks of 500 requests inside one benchmark; memory: idem on memstore and the peer's memory store, 50,000 requests per side; Redis: idem on redisstore and the peer's Redis store, each its own client of the same Redis, 10,000 per side; medians of 6 runs, benchstat in `results/go-peers-benchstat.txt`), %s, machine load %s at the start and %s at the end. Ratio < 1: idem faster. *keys executed twice*: of 50 keys sent by 20 concurrent copies each (`TestPeersExecutions` of that harness, table below; with Redis also over two instances); idem's is 0 in every case (asserted).\n\n", r.config["go-peers-date"], r.config["go-peers-load-start"], r.config["go-peers-load-end"])
	p("*allocs*: heap allocations per request of each side (idem / peer, fresh; replay), counted around every chunk (`runtime.MemStats.Mallocs`); the request itself (recorder, key) is in both.\n\n")
	p("| peer | framework | store | fresh: idem / peer per request | **idem ÷ peer, fresh** | replay: idem / peer per request | **idem ÷ peer, replay** | allocs | keys executed twice (1 instance; 2) |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, gp := range goPeers {
		for _, fw := range []struct{ name, label string }{{"gin", "Gin"}, {"nethttp", "net/http"}} {
			for _, st := range []struct{ bench, store string }{{"BenchmarkPeers", "memory"}, {"BenchmarkPeersRedis", "redis"}} {
				cells := make([]string, 0, 4)
				var allocs []string
				found := false
				for _, path := range []string{"fresh", "replay"} {
					n := st.bench + "/fw=" + fw.name + "/peer=" + gp.name + "/path=" + path
					ratio, ok := r.get(n, "idem/"+gp.name)
					if !ok {
						cells = append(cells, na, na)
						continue
					}
					found = true
					pi, _ := r.get(n, "idem-ns/op")
					pp, _ := r.get(n, gp.name+"-ns/op")
					cells = append(cells, dur(pi)+" / "+dur(pp), fmt.Sprintf("**%.2f**", ratio))
					if ai, ok := r.get(n, "idem-allocs/op"); ok {
						ap, _ := r.get(n, gp.name+"-allocs/op")
						allocs = append(allocs, fmt.Sprintf("%.0f / %.0f", ai, ap))
					}
				}
				if !found {
					continue
				}
				var twice []string
				for _, inst := range []string{"1", "2"} {
					if v, ok := r.get("BenchmarkExecutions/lib="+gp.name+"/fw="+fw.name+"/store="+st.store+"/instances="+inst, "keys-executed-twice"); ok {
						cell := num(v)
						if v > 0 {
							cell = "**" + cell + "**"
						}
						twice = append(twice, cell)
					}
				}
				tw := na
				if len(twice) > 0 {
					tw = strings.Join(twice, "; ")
				}
				ac := na
				if len(allocs) > 0 {
					ac = strings.Join(allocs, "; ")
				}
				p("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", gp.label, fw.label, st.store, cells[0], cells[1], cells[2], cells[3], ac, tw)
			}
		}
	}
	p("\n")
}

// writeExecutions writes the table of TestPeersExecutions' counts.
func writeExecutions(w io.Writer, r *results) {
	var names []string
	for n := range r.by {
		if strings.HasPrefix(n, "BenchmarkExecutions/") {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return
	}
	rank := func(n string) string { // idem first, then the peers; frameworks in the sections' order
		f := fields(n)
		lib := "1" + f["lib"]
		if f["lib"] == "idem" {
			lib = "0"
		}
		return lib + strconv.Itoa(slices.Index(frameworks, f["fw"])+1) + f["store"] + f["instances"]
	}
	sort.Slice(names, func(i, j int) bool { return rank(names[i]) < rank(names[j]) })
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("\n### %s\n\n", hExec)
	p("`TestPeersExecutions`: 50 fresh keys, each sent by 20 goroutines released together (1,000 requests), in process; each execution lasts 2 ms so that duplicates overlap it. With a Redis store the 20 copies are also spread over two instances (two apps, two engines or middlewares) sharing that Redis, as two replicas behind a load balancer would. Each goroutine is a client: an answer with Retry-After (idem's 409 in-progress and 503 store-unavailable) is re-sent after that delay, for up to 90 s; *answers* are the first answers. The test fails if idem executes a key twice or not at all, first answers anything but 201, 409 or 503, or leaves a client without its 201; the peers' counts are recorded, not asserted. A library that runs a key twice has charged twice: read its speed with this column.\n\n")
	p("| library | store | instances | keys executed twice (of 50), per framework | answers |\n|---|---|---|---|---|\n")
	type row struct {
		lib, store, instances string
		twice                 []string
		statuses              map[int]bool
	}
	var rows []*row
	for _, n := range names {
		f := fields(n)
		var rw *row
		for _, x := range rows {
			if x.lib == f["lib"] && x.store == f["store"] && x.instances == f["instances"] {
				rw = x
			}
		}
		if rw == nil {
			rw = &row{lib: f["lib"], store: f["store"], instances: f["instances"], statuses: map[int]bool{}}
			rows = append(rows, rw)
		}
		twice, _ := r.get(n, "keys-executed-twice")
		cell := f["fw"] + " " + num(twice)
		if twice > 0 {
			cell = "**" + cell + "**"
		}
		rw.twice = append(rw.twice, cell)
		for unit := range r.by[n] {
			if code, err := strconv.Atoi(strings.TrimPrefix(unit, "status-")); err == nil {
				rw.statuses[code] = true
			}
		}
	}
	for _, rw := range rows {
		codes := slices.Sorted(maps.Keys(rw.statuses))
		answers := make([]string, len(codes))
		for i, c := range codes {
			answers[i] = strconv.Itoa(c)
		}
		a := strings.Join(answers, ", ")
		if len(codes) == 1 && codes[0] == 201 {
			a = "201 only (duplicates waited)"
		}
		p("| %s | %s | %s | %s | %s |\n", rw.lib, rw.store, rw.instances, strings.Join(rw.twice, ", "), a)
	}
}

// fields splits a benchmark name's key=value parts.
func fields(name string) map[string]string {
	m := map[string]string{}
	for _, part := range strings.Split(name, "/") {
		if k, v, ok := strings.Cut(part, "="); ok {
			m[k] = v
		}
	}
	return m
}

// loadCases returns the load benchmark's services in run order and its
// levels, ascending.
func loadCases(r *results) (services []string, levels []int) {
	var names []string
	for n := range r.by {
		if strings.HasPrefix(n, "BenchmarkLoad/") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	seen := map[string]bool{}
	for _, n := range names {
		i := strings.LastIndex(n, "/c=")
		svc := strings.TrimPrefix(n[:i], "BenchmarkLoad/")
		c, _ := strconv.Atoi(n[i+3:])
		if !seen[svc] {
			seen[svc] = true
			services = append(services, svc)
		}
		if !slices.Contains(levels, c) {
			levels = append(levels, c)
		}
	}
	order := func(svc string) string { // bare, peers, then idem by store
		f := fields(svc)
		rank := map[string]string{"none": "0", "floor": "1", "builtin": "1", "gopotency": "1", "brightroom": "1", "idemlease": "1", "idem": "2"}[f["lib"]]
		st := map[string]string{"memory": "0", "redis": "1", "redis-plain": "2", "postgres": "3", "mysql": "4"}[f["store"]]
		fw := map[string]string{"gin": "0", "fiber": "1"}[f["fw"]]
		return fw + rank + st
	}
	sort.SliceStable(services, func(i, j int) bool { return order(services[i]) < order(services[j]) })
	slices.Sort(levels)
	return services, levels
}

// writeLoad writes the load benchmark's section (cmd/load).
func writeLoad(w io.Writer, r *results, png string) {
	services, levels := loadCases(r)
	if len(services) == 0 {
		return
	}
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("\n## %s\n\n", hLoad)
	p("`benchmarks/cmd/load`: a payments service as in `examples/` (POST /v1/payments `{\"amount\": N}` with `Idempotency-Key` and `X-User-Id`, 201 with the payment and a `Location`; the handler counts its executions per key) on Gin and on Fiber v2, as its own process, one process per row: no idempotency (*none*), idem on each store, and each peer (Fiber's built-in middleware with its memory storage and with `gofiber/storage/redis`; on Gin the floor of section 2b; the Go peers of section 2b, gopotency, bright-room/idem and idemlease, with their memory and Redis stores on Gin and gopotency also on Fiber, from the record of section 2b's harness run: `make bench-load` measures only the rows this tree builds). vegeta (as a library, keep-alive, one connection per worker) runs closed loop: each of the *workers* keeps one request outstanding, for the same time per row; every row is the median of the rounds, each round going over every row in turn. Traffic: %s.\n\n", r.config["loadrun-mix"])
	p("**Keeping the generator and the server apart on 2 cores**: %s. Redis, PostgreSQL and MySQL are shared servers of this machine, not pinned: their CPU comes out of both halves, so the rows on them also measure how much of the server's CPU the store takes. Closed loop means the generator never queues work the server has not answered. The generator has one core too, so the highest rows may be bounded by vegeta rather than by the server. *none* executes every request, duplicates and replays included, so it is no upper bound: a stored answer can be cheaper than running the handler again. Run %s: %s; machine load %s at the start, %s at the end.\n\n", r.config["loadrun-pinning"], r.config["loadrun-date"], r.config["loadrun-levels"], r.config["loadrun-start"], r.config["loadrun-end"])
	p("*errors*: transport errors and answers other than 201 or 409; *409*: duplicates answered in progress; *keys executed twice*: keys the handler ran more than once (duplicates and replays re-executed); *server CPU/req*: the server process's user+system CPU time (`/proc/<pid>/stat`) over the attack ÷ its requests (not Redis's, PostgreSQL's or MySQL's own CPU). Store *redis* is a go-redis client with its default options and the store's defaults: the per-record commands of concurrent requests batched by the store (stores/redisstore README, Batching); *redis-plain* is the same client with `redisstore.WithoutBatching()`, each command on its own pooled connection (pool of 10 connections per GOMAXPROCS: 10 here); *postgres* and *mysql* have a pool of %s connections (`-sqlconns`).", r.config["loadrun-sqlconns"])
	if d := r.config["loadpeers-date"]; d != "" {
		p(" The Go peers' rows (gopotency, brightroom, idemlease) are a record, not re-measured by `make bench-load` (this tree no longer builds them): %s.", r.config["loadpeers-how"])
	}
	p(" *requests/s* is the median of the rounds, with the smallest and largest round in parentheses; *keys executed twice* is the sum over every round.")
	p("\n\n| framework | library | store | workers | requests/s (rounds) | p50 | p99 | server CPU/req | errors | 409 | keys executed twice |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, svc := range services {
		f := fields(svc)
		for _, c := range levels {
			n := "BenchmarkLoad/" + svc + "/c=" + strconv.Itoa(c)
			rps, ok := r.get(n, "req/s")
			if !ok {
				continue
			}
			p50, _ := r.get(n, "p50-ns")
			p99, _ := r.get(n, "p99-ns")
			errs, _ := r.get(n, "errors")
			conf, _ := r.get(n, "conflicts")
			twice, _ := r.sum(n, "keys-executed-twice")
			rounds := ""
			if lo, hi, ok := r.span(n, "req/s"); ok && lo != hi {
				rounds = fmt.Sprintf(" (%.0f–%.0f)", lo, hi)
			}
			cpu := "–"
			if v, ok := r.get(n, "server-cpu-ns/req"); ok {
				cpu = dur(v)
			}
			lib := f["lib"]
			if loadRecordPeers[lib] {
				lib += " (record)"
			}
			p("| %s | %s | %s | %d | %.0f%s | %s | %s | %s | %s | %s | %s |\n", f["fw"], lib, f["store"], c, rps, rounds, dur(p50), dur(p99), cpu, num(errs), num(conf), num(twice))
		}
	}
	writeLoadRatios(w, r, services, levels)
	// results/load-profile.md (relative to the benchmarks module, where
	// scripts/bench.sh runs this command): the hand-written note on where
	// the load run's server time goes, from its profiles.
	if b, err := os.ReadFile(loadProfileNote); err == nil {
		p("\n%s", b)
	}
	if png != "" {
		p("\n![load: throughput and p99 per library](%s)\n", png)
	}
}

// loadChart draws the load benchmark: requests/s and p99 per service, one
// bar per concurrency level.
func loadChart(r *results, path string) error {
	services, levels := loadCases(r)
	if len(services) == 0 {
		return nil
	}
	labels := make([]string, len(services))
	for i, svc := range services {
		f := fields(svc)
		labels[i] = f["fw"] + "\n" + f["lib"] + "\n" + f["store"]
	}
	panel := func(title, ylabel, unit string, scale float64) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.Y.Label.Text = ylabel
		p.Legend.Top = true
		width := vg.Points(9)
		maxv := 0.0
		for i, c := range levels {
			vals := make(plotter.Values, len(services))
			for j, svc := range services {
				if v, ok := r.get("BenchmarkLoad/"+svc+"/c="+strconv.Itoa(c), unit); ok {
					vals[j] = v / scale
					maxv = max(maxv, vals[j])
				}
			}
			bars, err := plotter.NewBarChart(vals, width)
			if err != nil {
				return nil, err
			}
			bars.Color = palette[i%len(palette)]
			bars.LineStyle.Width = 0
			bars.Offset = vg.Length(float64(i)-float64(len(levels)-1)/2) * width
			p.Add(bars)
			p.Legend.Add(strconv.Itoa(c)+" workers", bars)
		}
		p.NominalX(labels...)
		p.X.Min, p.X.Max = -0.6, float64(len(services))-0.4
		p.Y.Min = 0
		if maxv > 0 {
			p.Y.Max = maxv * 1.25
		}
		p.Add(plotter.NewGrid())
		return p, nil
	}
	top, err := panel("load over loopback: throughput", "requests/s", "req/s", 1)
	if err != nil {
		return err
	}
	bottom, err := panel("load over loopback: p99 latency", "p99 (ms)", "p99-ns", 1e6)
	if err != nil {
		return err
	}
	const wd, ht = 36 * vg.Centimeter, 22 * vg.Centimeter
	img := vgimg.NewWith(vgimg.UseWH(wd, ht), vgimg.UseDPI(110))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Centimeter, PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	canvases := plot.Align([][]*plot.Plot{{top}, {bottom}}, tiles, dc)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// loadProfileNote is the hand-written note on the load run's profiles
// that section 9 includes when it exists.
const loadProfileNote = "results/load-profile.md"

// loadRecordPeers are the Go peers whose load rows are a record
// (results/load-go-peers.txt), not measured by make bench-load.
var loadRecordPeers = map[string]bool{"gopotency": true, "brightroom": true, "idemlease": true}

// writeLoadRatios writes idem ÷ no idempotency per framework, store and
// level (requests/s, server CPU per request, from the same run's medians),
// and how idem's requests/s and CPU per request move from the lowest level
// to the others.
func writeLoadRatios(w io.Writer, r *results, services []string, levels []int) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	get := func(svc string, c int, unit string) (float64, bool) {
		return r.get("BenchmarkLoad/"+svc+"/c="+strconv.Itoa(c), unit)
	}
	var rows []string
	for _, svc := range services {
		if fields(svc)["lib"] == "idem" {
			rows = append(rows, svc)
		}
	}
	if len(rows) == 0 || len(levels) == 0 {
		return
	}
	p("\n**idem ÷ no idempotency**, same framework, same run (medians of the rounds): requests/s (higher is better) and server CPU per request (lower is better), per store and workers; then idem's own requests/s and CPU per request at each level ÷ at %d workers.\n\n", levels[0])
	p("| framework | store |")
	for _, c := range levels {
		p(" req/s ÷ none, %d |", c)
	}
	for _, c := range levels {
		p(" CPU/req ÷ none, %d |", c)
	}
	for _, c := range levels[1:] {
		p(" req/s %d ÷ %d | CPU/req %d ÷ %d |", c, levels[0], c, levels[0])
	}
	p("\n|---|---|%s\n", strings.Repeat("---|", 2*len(levels)+2*(len(levels)-1)))
	ratio := func(a, b float64, okA, okB bool) string {
		if !okA || !okB || b == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f", a/b)
	}
	for _, svc := range rows {
		f := fields(svc)
		none := "fw=" + f["fw"] + "/lib=none/store=memory"
		p("| %s | %s |", f["fw"], f["store"])
		for _, c := range levels {
			a, okA := get(svc, c, "req/s")
			b, okB := get(none, c, "req/s")
			p(" %s |", ratio(a, b, okA, okB))
		}
		for _, c := range levels {
			a, okA := get(svc, c, "server-cpu-ns/req")
			b, okB := get(none, c, "server-cpu-ns/req")
			p(" %s |", ratio(a, b, okA, okB))
		}
		r0, ok0 := get(svc, levels[0], "req/s")
		c0, okc0 := get(svc, levels[0], "server-cpu-ns/req")
		for _, c := range levels[1:] {
			a, okA := get(svc, c, "req/s")
			b, okB := get(svc, c, "server-cpu-ns/req")
			p(" %s | %s |", ratio(a, r0, okA, ok0), ratio(b, c0, okB, okc0))
		}
		p("\n")
	}
	writeLoadTargets(w, r, rows)
}

// writeLoadTargets checks issue #52's targets on the load run, per
// framework, at 8, 64 and 256 workers: idem on Redis with its defaults
// (store redis): requests/s at 64 ≥ at 8 and at 256 ≥ at 64, ≥ 0.5 of no
// idempotency at 64, CPU per request at 64 ≤ at 8, ≥ 1.3× idemlease at 8
// and 64 (the record's rows: not paired); memory ≥ 0.8 of no idempotency
// at 8 and 64; PostgreSQL and MySQL requests/s at 64 ≥ at 8, with their
// ratio to no idempotency.
func writeLoadTargets(w io.Writer, r *results, rows []string) {
	get := func(svc string, c int, unit string) (float64, bool) {
		return r.get("BenchmarkLoad/"+svc+"/c="+strconv.Itoa(c), unit)
	}
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	var lines []string
	add := func(fw, target, value string) { lines = append(lines, "| "+fw+" | "+target+" | "+value+" |") }
	for _, svc := range rows {
		f := fields(svc)
		fw, none := f["fw"], "fw="+f["fw"]+"/lib=none/store=memory"
		ratio := func(a, b string, ca, cb int, unit string) (float64, bool) {
			x, ok1 := get(a, ca, unit)
			y, ok2 := get(b, cb, unit)
			if !ok1 || !ok2 || y == 0 {
				return 0, false
			}
			return x / y, true
		}
		switch f["store"] {
		case "redis":
			if v, ok := ratio(svc, svc, 64, 8, "req/s"); ok {
				add(fw, "Redis (defaults, batched): requests/s at 64 ÷ at 8 (≥ 1)", fmt.Sprintf("%.2f (%s)", v, mark(v >= 1)))
			}
			if v, ok := ratio(svc, svc, 256, 64, "req/s"); ok {
				add(fw, "Redis (defaults, batched): requests/s at 256 ÷ at 64 (≥ 1)", fmt.Sprintf("%.2f (%s)", v, mark(v >= 1)))
			}
			if v, ok := ratio(svc, none, 64, 64, "req/s"); ok {
				add(fw, "Redis (defaults, batched): requests/s ÷ no idempotency at 64 (≥ 0.5)", fmt.Sprintf("%.2f (%s)", v, mark(v >= 0.5)))
			}
			if v, ok := ratio(svc, svc, 64, 8, "server-cpu-ns/req"); ok {
				add(fw, "Redis (defaults, batched): server CPU/req at 64 ÷ at 8 (≤ 1)", fmt.Sprintf("%.2f (%s)", v, mark(v <= 1)))
			}
			for _, c := range []int{8, 64} {
				if v, ok := ratio(svc, "fw="+fw+"/lib=idemlease/store=redis", c, c, "req/s"); ok {
					add(fw, fmt.Sprintf("Redis (defaults, batched): requests/s ÷ idemlease at %d (≥ 1.3; idemlease from the record of another day and load, not paired)", c), fmt.Sprintf("%.2f (not judged: not a paired run)", v))
				}
			}
			if v, ok := ratio(svc, "fw="+fw+"/lib=idem/store=redis-plain", 8, 8, "req/s"); ok {
				add(fw, "Redis: defaults (batched) ÷ WithoutBatching at 8 (≥ 1: no loss at low concurrency)", fmt.Sprintf("%.2f (%s)", v, mark(v >= 1)))
			}
		case "memory":
			for _, c := range []int{8, 64} {
				if v, ok := ratio(svc, none, c, c, "req/s"); ok {
					add(fw, fmt.Sprintf("memory: requests/s ÷ no idempotency at %d (≥ 0.8)", c), fmt.Sprintf("%.2f (%s)", v, mark(v >= 0.8)))
				}
			}
		case "postgres", "mysql":
			if v, ok := ratio(svc, svc, 64, 8, "req/s"); ok {
				n8, _ := ratio(svc, none, 8, 8, "req/s")
				n64, _ := ratio(svc, none, 64, 64, "req/s")
				add(fw, f["store"]+": requests/s at 64 ÷ at 8 (≥ 1); ÷ no idempotency at 8 / 64", fmt.Sprintf("%.2f (%s); %.2f / %.2f", v, mark(v >= 1), n8, n64))
			}
		}
	}
	twice := 0.0
	for n := range r.by {
		if strings.HasPrefix(n, "BenchmarkLoad/") && strings.Contains(n, "/lib=idem/") {
			v, _ := r.sum(n, "keys-executed-twice")
			twice += v
		}
	}
	if len(lines) == 0 {
		return
	}
	add("all", "idem: keys executed twice, every row and round (0)", fmt.Sprintf("%.0f (%s)", twice, mark(twice == 0)))
	fmt.Fprintf(w, "\n**Targets of issue #52** on this run (a benchmark, not a test; one run on a shared machine, see the load averages above):\n\n")
	fmt.Fprintf(w, "| framework | target | this run |\n|---|---|---|\n")
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}
