#!/usr/bin/env bash
# `make bench`: runs the benchmarks module's quick profile (a few minutes on
# 2 cores) against the Redis and FerretDB test server of services.sh, then
# writes benchmarks/RESULTS.md (the current results only) and
# benchmarks/overhead.png with benchmarks/cmd/report. Raw output and
# benchstat's: benchmarks/results/; notes on earlier passes:
# benchmarks/results/history.md (written by hand, never by this script).
# `make bench-load` (`scripts/bench.sh load`): only the load benchmark over
# real sockets (benchmarks/cmd/load, 3-5 minutes), then RESULTS.md again
# from the last bench.txt and this load.txt.
# `scripts/bench.sh report`: only RESULTS.md (and its charts) again, from the
# result files there are (after `make soak` wrote results/recovery-soak.txt).
# `scripts/bench.sh peers` (`make bench-peers`): only the paired peer
# benchmarks (-count 6, with benchstat) and TestPeersExecutions of this
# module, then RESULTS.md again (section 2 from this run, the rest from the
# last bench.txt). results/go-peers.txt, the Go peers' figures of section
# 2b, is a record of a run outside this tree (RESULTS.md says why); no
# target here measures or rewrites it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/services.sh

BENCHSTAT_VERSION=v0.0.0-20260908200009-22c9c6c9d4da # golang.org/x/perf
BENCHSTAT=$(go env GOPATH)/bin/benchstat
if [ ! -x "$BENCHSTAT" ]; then
  echo "bench: installing benchstat (golang.org/x/perf/cmd/benchstat@$BENCHSTAT_VERSION)"
  go install "golang.org/x/perf/cmd/benchstat@$BENCHSTAT_VERSION"
fi

cd benchmarks
OUT=results
mkdir -p "$OUT"
RAW=$OUT/bench.txt
EXEC=$OUT/executions.txt
LOAD=$OUT/load.txt
PEERS=$OUT/peers.txt
GOPEERS=$OUT/go-peers.txt
LOADPEERS=$OUT/load-go-peers.txt # the Go peers' load rows: a record (RESULTS.md section 9 says when and how)
COMPARE=$OUT/compare.txt # benchstat of `scripts/bench.sh compare REV`
HISTORY=$OUT/recovery-history.txt # BenchmarkLapsedBehindHistory -bench.full: a record (RESULTS.md section 10 says how)
SOAK=$OUT/recovery-soak.txt # examples/payments TestRecoverySoak, written by make soak: a record (RESULTS.md section 11 says how)

report() { # RESULTS.md (today's numbers; it links benchstat's and compare's files), overhead.png and load.png from every result file there is
  local in=$RAW stat=$OUT/benchstat.txt
  for f in "$PEERS" "$EXEC" "$GOPEERS" "$LOAD" "$LOADPEERS" "$HISTORY" "$SOAK"; do if [ -f "$f" ]; then in="$in,$f"; fi; done
  for f in "$OUT/peers-benchstat.txt" "$OUT/go-peers-benchstat.txt"; do if [ -f "$f" ]; then stat="$stat,$f"; fi; done
  local cmp=()
  if [ -f "$COMPARE" ]; then cmp=(-compare "$COMPARE"); fi
  go run ./cmd/report -in "$in" -benchstat "$stat" "${cmp[@]}" -md RESULTS.md -png overhead.png -loadpng load.png
  echo "bench: wrote benchmarks/RESULTS.md, overhead.png and load.png"
}

executions() {
  echo "bench: executions under concurrent duplicates (TestPeersExecutions)"
  rm -f "$EXEC"
  go test -count=1 -run '^TestPeersExecutions$' . -peers.out "$EXEC" >/dev/null || { echo "bench: TestPeersExecutions failed" >&2; exit 1; }
}

# compare REV: the benchmarks module's test binary built at REV (the base,
# extracted with git archive) and at the working tree (new), run in turns
# on this machine (base, new, then new, base, ...) for COMPARE_ROUNDS
# rounds (default 6), then benchstat base vs new into $COMPARE. Runs hours
# apart, often on another machine, cannot show whether a change made a row
# slower; turns minutes apart on the same machine can.
if [ "${1:-}" = compare ]; then
  [ -f "$RAW" ] || { echo "bench compare: run make bench first ($ROOT/benchmarks/$RAW is missing)" >&2; exit 1; }
  BASE=${2:?usage: scripts/bench.sh compare REV}
  BASEREV=$(git -C "$ROOT" rev-parse --short "$BASE^{commit}")
  SRC=$ROOT/.tmp/compare-base
  rm -rf "$SRC" && mkdir -p "$SRC" "$ROOT/.tmp/bin"
  git -C "$ROOT" archive "$BASEREV" | tar -x -C "$SRC"
  echo "bench compare: building the benchmarks at $BASEREV and at the working tree"
  (cd "$SRC/benchmarks" && go test -c -o "$ROOT/.tmp/bin/bench-base.test" .)
  go test -c -o "$ROOT/.tmp/bin/bench-new.test" .
  rm -rf "$SRC"
  rm -f "$OUT/compare-base.txt" "$OUT/compare-new.txt"
  one() { # one <base|new>: one round of one binary
    local bin=$ROOT/.tmp/bin/bench-$1.test out=$OUT/compare-$1.txt
    "$bin" -test.run '^$' -test.bench '^BenchmarkMiddleware$' -test.benchmem -test.benchtime=20000x >>"$out"
    "$bin" -test.run '^$' -test.bench '^(BenchmarkEngine|BenchmarkStore)$' -test.benchmem -test.benchtime=300x >>"$out"
    "$bin" -test.run '^$' -test.bench '^(BenchmarkRedisFloor|BenchmarkPostgresFloor|BenchmarkMySQLFloor)$' -test.benchmem -test.benchtime=4000x >>"$out"
  }
  rounds=${COMPARE_ROUNDS:-6}
  for i in $(seq "$rounds"); do
    echo "bench compare: round $i of $rounds"
    if [ $((i % 2)) = 1 ]; then one base; one new; else one new; one base; fi
  done
  if grep -qE '^(--- FAIL|FAIL|panic)' "$OUT/compare-base.txt" "$OUT/compare-new.txt"; then echo "bench compare: a benchmark failed; see $OUT/compare-*.txt" >&2; exit 1; fi
  {
    echo "compare-base: $BASEREV"
    echo "compare-date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "compare-rounds: $rounds"
    "$BENCHSTAT" -ignore cpu,mongo-server base="$OUT/compare-base.txt" new="$OUT/compare-new.txt"
  } >"$COMPARE"
  report
  exit 0
fi

if [ "${1:-}" = report ]; then # RESULTS.md again from the result files there are (e.g. after make soak wrote results/recovery-soak.txt)
  [ -f "$RAW" ] || { echo "bench report: run make bench first ($ROOT/benchmarks/$RAW is missing)" >&2; exit 1; }
  report
  exit 0
fi

if [ "${1:-}" = peers ]; then
  [ -f "$RAW" ] || { echo "bench peers: run make bench first ($ROOT/benchmarks/$RAW is missing)" >&2; exit 1; }
  {
    echo "peers-date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "peers-load-start: $(cut -d' ' -f1-3 /proc/loadavg)"
  } >"$PEERS"
  echo "bench: paired peers, -count 6"
  go test -run '^$' -bench '^(BenchmarkFiberPeer|BenchmarkFiberV3Peer|BenchmarkNetHTTPPeer|BenchmarkGinPeer)$' -benchtime=50000x -count=6 . | tee -a "$PEERS" | grep -E '^(Benchmark|--- FAIL|FAIL|panic)' || true
  go test -run '^$' -bench '^(BenchmarkFiberRedisPeer|BenchmarkFiberV3RedisPeer)$' -benchtime=10000x -count=6 . | tee -a "$PEERS" | grep -E '^(Benchmark|--- FAIL|FAIL|panic)' || true
  echo "peers-load-end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$PEERS"
  if grep -qE '^(--- FAIL|FAIL|panic)' "$PEERS"; then echo "bench: a benchmark failed; see $ROOT/benchmarks/$PEERS" >&2; exit 1; fi
  "$BENCHSTAT" "$PEERS" >"$OUT/peers-benchstat.txt"
  executions
  report
  exit 0
fi

if [ "${1:-}" = load ]; then
  [ -f "$RAW" ] || { echo "bench-load: run make bench first ($ROOT/benchmarks/$RAW is missing)" >&2; exit 1; }
  BIN=$ROOT/.tmp/bin/idem-load
  mkdir -p "$(dirname "$BIN")"
  go build -o "$BIN" ./cmd/load
  # The generator re-executes itself on CPU 1 and starts each server on CPU 0 (taskset).
  "$BIN" -out "$LOAD" -levels "${LOAD_LEVELS:-8,64,256}" -duration "${LOAD_DURATION:-2s}" -count "${LOAD_COUNT:-3}" -only "${LOAD_ONLY:-}"
  report
  exit 0
fi

rm -f "$PEERS" "$OUT/peers-benchstat.txt" # this run measures the peers itself
{
  echo "machine: $(uname -srm), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM"
  echo "go: $(go version | awk '{print $3}')"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "load-start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "redis: $(redis-cli -u "$IDEM_REDIS_URL" info server 2>/dev/null | awk -F: '/^redis_version/ {print $2}' | tr -d '\r') at $IDEM_REDIS_URL"
} >"$RAW"

run() { # run <label> <go test args...>: appends to $RAW, shows progress
  echo "bench: $1"
  shift
  go test -run '^$' "$@" . | tee -a "$RAW" | grep -E '^(Benchmark|--- FAIL|FAIL|panic)' || true
}
run "middleware per framework and Fiber's built-in (fixed op count: fresh records accumulate equally)" \
  -bench '^(BenchmarkMiddleware|BenchmarkFiberBuiltin|BenchmarkFiberPeer|BenchmarkFiberV3Builtin|BenchmarkFiberV3Peer|BenchmarkNetHTTPPeer|BenchmarkGinPeer)$' -benchtime=100000x -count=5 -benchmem
run "idem with Redis paired with Fiber's built-in on gofiber/storage/redis" \
  -bench '^(BenchmarkFiberRedisPeer|BenchmarkFiberV3RedisPeer)$' -benchtime=20000x -count=5 -benchmem
run "stores, engine round trips, Redis floor" \
  -bench '^(BenchmarkStore|BenchmarkEngine|BenchmarkRedisFloor|BenchmarkPostgresFloor|BenchmarkMySQLFloor)$' -benchtime=1s -count=3 -benchmem
run "memstore scale (10^3, 10^5, 10^6 records)" \
  -bench '^BenchmarkMemScale$' -benchtime=1s -count=3 -benchmem -bench.full
run "memstore retention, Redis bytes per record" \
  -bench '^(BenchmarkMemRetention|BenchmarkRedisRecordSize)$' -benchtime=1x -bench.full
run "contention: 1,000 duplicates" \
  -bench '^BenchmarkContention$' -benchtime=10x
run "end to end over loopback (examples/gin, examples/fiber)" \
  -bench '^BenchmarkE2E$' -benchtime=60000x -bench.full
run "instances sharing one Redis (1, 2, 4, 8)" \
  -bench '^BenchmarkInstances$' -benchtime=3000x -count=3
echo "load-end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$RAW"
executions

if grep -qE '^(--- FAIL|FAIL|panic)' "$RAW"; then
  echo "bench: a benchmark failed; see $ROOT/benchmarks/$RAW" >&2
  exit 1
fi
"$BENCHSTAT" "$RAW" >"$OUT/benchstat.txt"
report
