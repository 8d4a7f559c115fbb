package main

import (
	"fmt"
	"io"
	"strconv"
)

// hHistory is the heading of the recovery-behind-a-history section.
const hHistory = "10. Recovery behind a history of completed records"

// historyFile is the record of BenchmarkLapsedBehindHistory with
// -bench.full that scripts/bench.sh reads when it is there (writing
// 100,000 records per store takes minutes: not part of make bench).
const historyFile = "results/recovery-history.txt"

// historyStores and historySizes are the rows the section shows when
// measured.
var (
	historyStores = []string{"memory", "redis", "redis-cluster", "postgres", "mysql", "mongo"}
	historySizes  = []int{1_000, 10_000, 100_000, 1_000_000}
)

// writeHistory writes the section from BenchmarkLapsedBehindHistory's
// samples, and its target: one Lapsed finds the crashed record at every
// size measured.
func writeHistory(w io.Writer, r *results, targets *[]target) {
	var rows []string
	for _, st := range historyStores {
		for _, n := range historySizes {
			name := "BenchmarkLapsedBehindHistory/store=" + st + "/completed=" + strconv.Itoa(n)
			passes, ok := r.get(name, "passes")
			if !ok {
				continue
			}
			first, _ := r.get(name, "first")
			ms, _ := r.get(name, "ms-to-find")
			seed := "–"
			if sec, ok := r.get(name, "s-to-seed"); ok {
				seed = strconv.FormatFloat(sec, 'f', 1, 64) + " s"
			}
			find := strconv.FormatFloat(ms, 'g', 3, 64) + " ms"
			if ms >= 1000 {
				find = strconv.FormatFloat(ms/1000, 'f', 1, 64) + " s"
			}
			rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | %s | %s |\n", st, num(float64(n)), num(first), num(passes), find, seed))
			*targets = append(*targets, target{group: "a crashed record behind a history of completed ones found by the first Lapsed(64)",
				item: st + " " + num(float64(n)), measured: num(passes) + " pass", met: passes == 1, known: true})
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## %s\n\n", hHistory)
	fmt.Fprintf(w, "One crashed record (lease 300 ms, never claimed) behind *completed* recoverable records (acquired, given a recovery payload, completed), then `Lapsed(64)` until it returns the crashed record (`storetest.PassesUntilLapsed`). The history is seeded by `tools/history.Seed`: one record written through the Store API as the template, then copied by the store's own server under fresh keys, each copy the row, document or value the store's `Complete` left (PostgreSQL and MySQL: `INSERT … SELECT` over generated keys; MongoDB wire: `insertMany`; Redis and Redis Cluster: pipelined `SET`s; memory: every record through the Store API). *first*: records the first call returned; *passes*: calls until the crashed record came (a recoverer waited `RecoverEvery`, 5 s, after a pass that found less than a batch); *to find*: those calls' time; *seeding*: the history's seeding time. Before issue #48 Redis answered 0 records first and took 16 passes at 1,000 and 1,563 at 100,000 (its index kept the entries of completed records). A record of `%s` (run on this machine, one store after another, `go test -run '^$' -bench 'LapsedBehindHistory/store=<store>/' -benchtime 1x -bench.full -history 100000,1000000 .`; the redis-cluster rows need `IDEM_REDIS_CLUSTER_ADDRS`; the file's comments give the machine's load and notes per store). *mongo* is the FerretDB test server (FerretDB v1 on SQLite), which evaluates range queries and sorts itself over every document of the collection: its one pass takes longer the larger the history (146 s at 1,000,000), where MongoDB reads the `dueAt` index.\n\n", historyFile)
	fmt.Fprintf(w, "| store | completed | first | passes | to find | seeding |\n|---|---|---|---|---|---|\n")
	for _, row := range rows {
		fmt.Fprint(w, row)
	}
}
