#!/usr/bin/env bash
# `make test-under-load`: make test with a CPU-bound background load of
# LOAD_WORKERS busy threads (default 2 x the cores, tools/cpuload), as on a
# shared CI runner or a laptop building beside the tests; prints the wall
# time, the load average before and after, and exits with make test's status.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
workers=${LOAD_WORKERS:-$((2 * $(nproc)))}
mkdir -p .tmp/bin
GOWORK=off go build -o .tmp/bin/cpuload tools/cpuload/main.go || exit 1
# -parent: the load stops by itself if this script is killed
.tmp/bin/cpuload -workers "$workers" -parent $$ &
load_pid=$!
trap 'kill -TERM "$load_pid" 2>/dev/null; wait "$load_pid" 2>/dev/null' EXIT
before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date +%s)
./scripts/test.sh
status=$?
took=$(($(date +%s) - start))
after=$(cut -d' ' -f1-3 /proc/loadavg)
verdict=passed
[ $status -eq 0 ] || verdict=FAILED
printf 'make test-under-load: make test %s in %dm%02ds beside %d busy threads on %d cores (load average %s at the start, %s at the end)\n' \
  "$verdict" $((took / 60)) $((took % 60)) "$workers" "$(nproc)" "$before" "$after"
exit $status
