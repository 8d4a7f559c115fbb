package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"
)

// The sections' headings, which today's numbers link.
const (
	hMiddleware = "1. Middleware cost per framework (memory store, in-process, no network)"
	hFiber      = "2. The peers: Fiber's built-in idempotency middleware (v2 and v3)"
	hGoPeers    = "2b. Go peers on Gin and net/http"
	hExec       = "Executions under concurrent duplicates"
	hStores     = "3. Stores"
	hRedisFloor = "4. Redis versus its own floor"
	hPGFloor    = "PostgreSQL versus its own floor"
	hMySQLFloor = "MySQL versus its own floor"
	hScale      = "5. Scale"
	hContention = "6. Contention: 1,000 concurrent duplicates of one request"
	hE2E        = "7. End to end over loopback"
	hInstances  = "8. Instances sharing one Redis"
	hLoad       = "9. Load over real sockets (`make bench-load`)"
)

// anchor returns the link GitHub gives a heading: lower case, spaces to
// '-', every other character but letters, digits, '-' and '_' dropped.
func anchor(heading string) string {
	var b strings.Builder
	b.WriteByte('#')
	for _, c := range strings.ToLower(heading) {
		switch {
		case c == ' ':
			b.WriteByte('-')
		case c == '-' || c == '_' || unicode.IsLetter(c) || unicode.IsDigit(c):
			b.WriteRune(c)
		}
	}
	return b.String()
}

// span formats the range of vs with f: "a" or "a–b".
func span(vs []float64, f func(float64) string) string {
	if len(vs) == 0 {
		return na
	}
	lo, hi := slices.Min(vs), slices.Max(vs)
	if f(lo) == f(hi) {
		return f(lo)
	}
	return f(lo) + "–" + f(hi)
}

func ratio(v float64) string { return fmt.Sprintf("%.2f", v) }

// writeHeadlines writes today's numbers: one line per question, each
// answered from this run's medians and linked to its table. A question
// the run did not measure is left out.
func writeHeadlines(w io.Writer, r *results) {
	fmt.Fprintf(w, "| question | this run | table |\n|---|---|---|\n")
	line := func(q, a, heading string) {
		fmt.Fprintf(w, "| %s | %s | [%s](%s) |\n", q, a, strings.SplitN(heading, " ", 2)[0], anchor(heading))
	}

	// Middleware cost.
	var dFresh, dReplay, aFresh, aReplay []float64
	for _, fw := range frameworks {
		base := "BenchmarkMiddleware/fw=" + fw + "/path="
		bare, ok1 := r.ns(base + "bare")
		fresh, ok2 := r.ns(base + "fresh")
		replay, ok3 := r.ns(base + "replay")
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		ba, _ := r.get(base+"bare", "allocs/op")
		fa, _ := r.get(base+"fresh", "allocs/op")
		ra, _ := r.get(base+"replay", "allocs/op")
		dFresh, dReplay = append(dFresh, fresh-bare), append(dReplay, replay-bare)
		aFresh, aReplay = append(aFresh, fa-ba), append(aReplay, ra-ba)
	}
	if len(dFresh) > 0 {
		line("What does idem add to one request (memory store, in process, 6 frameworks)?",
			fmt.Sprintf("fresh +%s and +%s allocations; replay +%s and +%s allocations", span(dFresh, dur), span(aFresh, num), span(dReplay, dur), span(aReplay, num)), hMiddleware)
	}

	// Fiber's built-in, paired.
	var fiber []string
	for _, pe := range peers {
		f, ok1 := r.get(pe.paired+"/path=fresh", "idem/builtin")
		rp, ok2 := r.get(pe.paired+"/path=replay", "idem/builtin")
		if ok1 && ok2 {
			fiber = append(fiber, fmt.Sprintf("%s: fresh **%.2f**, replay **%.2f**", pe.label, f, rp))
		}
	}
	if len(fiber) > 0 {
		line("idem ÷ Fiber's built-in idempotency middleware, paired (< 1: idem faster)", strings.Join(fiber, "; "), hFiber)
	}

	// Go peers, paired (the recorded run).
	var goPeer []string
	for _, st := range []struct{ bench, label string }{{"BenchmarkPeers", "memory"}, {"BenchmarkPeersRedis", "Redis"}} {
		var fresh, replay []float64
		for _, gp := range goPeers {
			for _, fw := range []string{"gin", "nethttp"} {
				n := st.bench + "/fw=" + fw + "/peer=" + gp.name + "/path="
				if v, ok := r.get(n+"fresh", "idem/"+gp.name); ok {
					fresh = append(fresh, v)
				}
				if v, ok := r.get(n+"replay", "idem/"+gp.name); ok {
					replay = append(replay, v)
				}
			}
		}
		if len(fresh) > 0 {
			goPeer = append(goPeer, fmt.Sprintf("%s: fresh %s, replay %s", st.label, span(fresh, ratio), span(replay, ratio)))
		}
	}
	if len(goPeer) > 0 {
		line("idem ÷ the Go peers (gopotency, bright-room/idem, idemlease) on Gin and net/http, paired, "+r.config["go-peers-date"], strings.Join(goPeer, "; "), hGoPeers)
	}

	// Keys executed twice under concurrent duplicates.
	idemTwice, idemCases := 0.0, 0
	twice := map[string]float64{}
	for n := range r.by {
		if !strings.HasPrefix(n, "BenchmarkExecutions/") {
			continue
		}
		v, _ := r.get(n, "keys-executed-twice")
		f := fields(n)
		if f["lib"] == "idem" {
			idemTwice += v
			idemCases++
		} else if v > twice[f["lib"]+" ("+f["store"]+", "+f["instances"]+" instances)"] {
			twice[f["lib"]+" ("+f["store"]+", "+f["instances"]+" instances)"] = v
		}
	}
	if idemCases > 0 {
		a := fmt.Sprintf("idem: %s in %d cases", num(idemTwice), idemCases)
		var others []string
		for k, v := range twice {
			if v > 0 {
				others = append(others, fmt.Sprintf("%s: **%s**", k, num(v)))
			}
		}
		slices.Sort(others)
		if len(others) > 0 {
			a += "; " + strings.Join(others, ", ")
		}
		line("Keys executed twice, of 50 keys sent by 20 concurrent copies each", a, hExec)
	}

	// Round trips.
	var off []string
	stores := 0
	floors := map[string]float64{"fresh": 2, "replay": 1, "conflict": 1}
	for _, st := range []string{"redis", "mongo", "postgres", "mysql"} {
		seen := false
		for _, path := range []string{"fresh", "replay", "conflict"} {
			if rt, ok := r.get("BenchmarkEngine/store="+st+"/path="+path, "roundtrips/op"); ok {
				seen = true
				if rt > floors[path]+0.01 {
					off = append(off, fmt.Sprintf("**%s %s %s**", st, path, num(rt)))
				}
			}
		}
		if seen {
			stores++
		}
	}
	if stores > 0 {
		a := fmt.Sprintf("at the floor on all %d shared stores: 2 for a first execution, 1 for a replay or a 409", stores)
		if len(off) > 0 {
			a = fmt.Sprintf("at the floor (2 for a first execution, 1 for a replay or a 409) on %d shared stores, except %s", stores, strings.Join(off, ", "))
		}
		line("Round trips per request through the engine", a, hStores)
	}

	// Throughput against the store's own client.
	var floor []string
	for _, fl := range []struct{ label, bench string }{{"Redis", "BenchmarkRedisFloor"}, {"PostgreSQL", "BenchmarkPostgresFloor"}, {"MySQL", "BenchmarkMySQLFloor"}} {
		if pr, ok := r.get(fl.bench+"/impl=paired", "idem/bare"); ok {
			floor = append(floor, fmt.Sprintf("%s **%.2f**", fl.label, 1/pr))
		}
	}
	if len(floor) > 0 {
		line("Fresh-request throughput ÷ a bare client sending two plain commands, paired", strings.Join(floor, ", "), hRedisFloor)
	}

	// Contention.
	var storms []string
	for _, st := range []string{"memory", "redis"} {
		if ex, ok := r.get("BenchmarkContention/store="+st, "executions/op"); ok {
			storms = append(storms, st+" "+num(ex))
		}
	}
	if len(storms) > 0 {
		line("Executions per storm of 1,000 concurrent duplicates", strings.Join(storms, ", "), hContention)
	}

	// Scale.
	small, ok1 := r.ns("BenchmarkMemScale/records=1000")
	big, ok2 := r.ns("BenchmarkMemScale/records=1000000")
	if ok1 && ok2 {
		a := fmt.Sprintf("%.2f× its time at 10^3", big/small)
		if base, ok := r.get("BenchmarkMemRetention", "heap-base-B"); ok {
			after, _ := r.get("BenchmarkMemRetention", "heap-after-B")
			a += fmt.Sprintf("; heap after retention %.2f× its baseline", after/base)
		}
		line("memstore at 10^6 live records", a, hScale)
	}

	// End to end.
	var e2e []string
	for _, mode := range []struct{ mode, label string }{{"idem-memory", "memory"}, {"idem-redis", "Redis"}} {
		var rel []float64
		for _, fw := range frameworks {
			for _, traffic := range []string{"fresh", "replay"} {
				v, ok1 := r.get("BenchmarkE2E/fw="+fw+"/mode="+mode.mode+"/traffic="+traffic, "req/s")
				base, ok2 := r.get("BenchmarkE2E/fw="+fw+"/mode=no-idem/traffic="+traffic, "req/s")
				if ok1 && ok2 && base > 0 {
					rel = append(rel, v/base)
				}
			}
		}
		if len(rel) > 0 {
			e2e = append(e2e, mode.label+" "+span(rel, ratio))
		}
	}
	if len(e2e) > 0 {
		line("Requests/s over loopback, idem ÷ the same service without idem", strings.Join(e2e, ", "), hE2E)
	}

	// Instances.
	var inst []float64
	for _, n := range []string{"1", "2", "4", "8"} {
		if ex, ok := r.get("BenchmarkInstances/instances="+n, "executions/logical"); ok {
			inst = append(inst, ex)
		}
	}
	if len(inst) > 0 {
		line(fmt.Sprintf("Executions per logical request, 1 to %d instances sharing Redis", 1<<(len(inst)-1)), span(inst, num), hInstances)
	}

	// Load.
	services, levels := loadCases(r)
	if len(services) > 0 {
		var idemTwice, peerTwice float64
		for _, svc := range services {
			f := fields(svc)
			for _, c := range levels {
				v, ok := r.get(fmt.Sprintf("BenchmarkLoad/%s/c=%d", svc, c), "keys-executed-twice")
				switch {
				case !ok || f["lib"] == "none":
				case f["lib"] == "idem":
					idemTwice += v
				default:
					peerTwice += v
				}
			}
		}
		line("Keys executed twice under load over real sockets (duplicates and replays mixed in)",
			fmt.Sprintf("idem %s; the peers %s in all; requests/s and p99 per library in the table", num(idemTwice), num(peerTwice)), hLoad)
		var redis []string
		for _, svc := range services {
			f := fields(svc)
			if f["lib"] != "idem" || !strings.HasPrefix(f["store"], "redis") {
				continue
			}
			idem, ok1 := r.get(fmt.Sprintf("BenchmarkLoad/%s/c=64", svc), "req/s")
			none, ok2 := r.get(fmt.Sprintf("BenchmarkLoad/fw=%s/lib=none/store=memory/c=64", f["fw"]), "req/s")
			if ok1 && ok2 && none > 0 {
				redis = append(redis, fmt.Sprintf("%s %s %.2f", f["fw"], f["store"], idem/none))
			}
		}
		if len(redis) > 0 {
			line("Requests/s under load at 64 workers, idem on Redis ÷ the same service without idempotency (redis: the store's defaults, batched; redis-plain: WithoutBatching)",
				strings.Join(redis, ", "), hLoad)
		}
	}
	fmt.Fprintln(w)
}
