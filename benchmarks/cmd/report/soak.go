package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// hSoak is the heading of the recovery soak's section.
const hSoak = "11. Recovery soak: crashes under traffic behind a history"

// soakFile is the record of examples/payments TestRecoverySoak
// (-soak-out) that scripts/bench.sh reads when it is there (make soak
// writes it: minutes per store, not part of make bench).
const soakFile = "results/recovery-soak.txt"

// soakStores are the stores the section shows when measured.
var soakStores = []string{"redis", "postgres", "mysql", "mongo"}

// writeSoak writes the section from TestRecoverySoak's lines, and its
// targets: a lapsed record claimed within 2 × RecoverEvery of its lapse
// (p99), and a recovery index that holds nothing once nothing is in
// flight, whatever the history.
func writeSoak(w io.Writer, r *results, targets *[]target) {
	var rows, series []string
	for _, st := range soakStores {
		name := "BenchmarkRecoverySoak/store=" + st
		claims, ok := r.get(name, "claims")
		if !ok {
			continue
		}
		g := func(unit string) float64 { v, _ := r.get(name, unit); return v }
		traffic, _ := r.ns(name)
		every, lease := g("every-ms"), g("lease-ms")
		mem := na
		if g("mem-start-B") > 0 {
			mem = bytesStr(g("mem-start-B")) + " → " + bytesStr(g("mem-end-B"))
		}
		pays := num(g("payments"))
		if _, ok := r.get(name, "completed"); ok {
			pays += fmt.Sprintf(" (%s / %s / %s)", num(g("completed")), num(g("parked")), num(g("answered-5xx")))
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s at %.0f/s | %s | %s + %s | %s | %s / %s / %s | %s | %s | %s / %s / %s | %s | %.1f → %.1f |\n",
			st, num(g("history")), time.Duration(traffic).Round(time.Second), g("req/s"), pays, num(g("kills")), num(g("held")), num(claims),
			ms(g("p50-ms")), ms(g("p99-ms")), ms(g("max-ms")), ms(2*every), ms(lease),
			num(g("index-min")), num(g("index-max")), num(g("index-last")), mem, g("load-start"), g("load-end")))
		*targets = append(*targets,
			target{group: "a lapsed record claimed within lease + 2 × RecoverEvery of its holder's crash (soak, p99 lapse→claim ≤ 2 × RecoverEvery)",
				item: st, measured: ms(g("p99-ms")), met: claims > 0 && g("p99-ms") <= 2*every, known: claims > 0},
			target{group: "the recovery index bounded by in-flight and due records, not by completed ones (soak: max, and last once nothing is in flight, 0)",
				item: st, measured: "max " + num(g("index-max")) + " behind " + num(g("history")) + ", last " + num(g("index-last")), met: g("index-last") == 0, known: true})
		series = append(series, fmt.Sprintf("- %s: %s\n", st, soakSeries(r, name)))
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## %s\n\n", hSoak)
	fmt.Fprintf(w, "The payments service (examples/payments) on each shared store in turn, behind a history of *completed* recoverable records (`tools/history.Seed`, as in section 10: one through the Store API, the rest copied by the store's server): three instances with recoverers (RecoverEvery 1 s) take fresh payments at a steady rate, no client retries, and at every interval one of the three is SIGKILLed under its traffic and restarted while a fourth instance (its recoverer idle) holds a payment at each of the seven pause points and is SIGKILLed there. *lapse → claim*: how long each recovered record's lease had lapsed, by the store's clock, when a recoverer claimed it (each takeover's log line: the records of crashed instances, and those whose handler answered 5xx after a journaled step, a store timeout on a loaded machine, whose lease lapses at once; a record claimed again after a failed run counts its backoff too); a crashed record is claimed within lease + 2 × RecoverEvery of its last renewal when this stays within 2 × RecoverEvery. A recoverer claims a record when one of its runs (4 at once, the default `RecoverConcurrency`) is free, so a burst of crashed payments (all those in flight on a killed instance) waits behind the runs before it: on a loaded machine, where each run takes long, that queue, not the index, sets the tail. *index*: the recovery index's size, sampled every second (Redis: the sorted set's ZCARD; PostgreSQL and MySQL: rows with `due_at`; MongoDB wire: documents with `dueAt`). *Redis memory*: the server's `used_memory`, shared with other work on this machine. Checked in the same run, as a test: every payment answered 201 completed, one ledger row per completed payment, a charge per completed or parked one, no two runs of a key at once, and an empty index once nothing is in flight. A record of `%s` (`make soak`; the file's first line gives the command and the history per store).\n\n", soakFile)
	fmt.Fprintf(w, "| store | history | traffic | payments (completed / parked uncertain / answered 5xx) | crashes (under traffic + held) | claims | lapse → claim p50 / p99 / max | 2 × RecoverEvery | lease | index min / max / last | Redis memory | load average |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range rows {
		fmt.Fprint(w, row)
	}
	fmt.Fprintf(w, "\nThe index over time (entries, every 15 s from the traffic's start, the last after every payment settled; in brackets the claims logged since the sample before and their p99 lapse → claim):\n\n")
	for _, s := range series {
		fmt.Fprint(w, s)
	}
}

// soakSeries lists the index samples of the store's soak in time order,
// each with the claims logged since the one before and their p99
// lapse→claim when the record has them.
func soakSeries(r *results, name string) string {
	type sample struct {
		at                   int
		index, claims, p99ms float64
		hasClaims            bool
	}
	var ss []sample
	for k := range r.by {
		at, ok := strings.CutPrefix(k, name+"/at=")
		if !ok {
			continue
		}
		sec, err := strconv.Atoi(strings.TrimSuffix(at, "s"))
		if err != nil {
			continue
		}
		v, _ := r.get(k, "index")
		c, has := r.get(k, "claims")
		p99, _ := r.get(k, "p99-ms")
		ss = append(ss, sample{sec, v, c, p99, has})
	}
	slices.SortFunc(ss, func(a, b sample) int { return a.at - b.at })
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = fmt.Sprintf("%ds %s", s.at, num(s.index))
		if s.hasClaims && s.claims > 0 {
			parts[i] += fmt.Sprintf(" (%s claims, p99 %s)", num(s.claims), ms(s.p99ms))
		}
	}
	return strings.Join(parts, ", ")
}

// ms formats milliseconds for a table.
func ms(v float64) string { return dur(v * 1e6) }
