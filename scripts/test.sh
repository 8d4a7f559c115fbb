#!/usr/bin/env bash
# `make test`: starts what the tests need, then vets and tests every module
# of the workspace with the race detector, and builds each published module
# on its own (GOWORK=off) as a user's `go get` would.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/services.sh
# Every service is up now: a test that finds one missing fails instead of skipping.
export CI=${CI:-true}

status=0
# first, so that the tests of tools/release, which build them again from a
# user's module, find their dependencies in the build cache
echo "=== published modules build on their own (GOWORK=off)"
# every go.mod outside examples/, benchmarks/, tests/ and tools/ (tools/release)
published=$(cd tools/release && GOWORK=off go run . modules -root "$ROOT") || { echo "tools/release modules failed"; status=1; }
for dir in $published; do
  (cd "$dir" && GOWORK=off go build ./...) || { echo "GOWORK=off build failed in $dir"; status=1; }
done

# Budgets. go test's -timeout catches a hang; it is not a speed target
# (speed targets live in benchmarks), and it must hold where make test runs
# beside other work: at a load average of 8-16 on 2 cores (make
# test-under-load runs the suite so) a package whose time is CPU takes 4-8
# times as long as alone. On a quiet machine every module passed within 5m,
# and tests/chaos, which waits for leases, restarts and failovers of its own
# servers, within 8m beside the other modules (it failed so under load):
# 15m per module, 30m for tests/chaos (free while the other modules run,
# since it is waited for after them). IDEM_TEST_TIMEOUT and
# IDEM_CHAOS_TIMEOUT override them.
module_timeout=${IDEM_TEST_TIMEOUT:-15m}
chaos_timeout=${IDEM_CHAOS_TIMEOUT:-30m}

modules=$(go list -m -f '{{.Dir}}' 2>/dev/null || true)
[ -n "$modules" ] || { echo "make test: go list -m found no module of the workspace (GOWORK=$(go env GOWORK)); nothing would be tested" >&2; exit 1; }
# tests/chaos spends most of its time waiting for leases, restarts and
# failovers of its own servers: it runs beside the other modules (its
# output is printed after them). The other modules run in
# IDEM_TEST_LANES lanes (2), each taking the next module when it is done,
# the longest known first: most of their time is spent waiting for
# servers, leases and child processes, not on the CPU. Each module's
# output is printed whole when it ends. Both keep make test within 15
# minutes on 2 cores.
lanes=${IDEM_TEST_LANES:-2}
logs=$(mktemp -d)
chaos_log="$logs/chaos"
(cd tests/chaos && go vet ./... && go test -race -count=1 -timeout "$chaos_timeout" ./...) >"$chaos_log" 2>&1 &
chaos_pid=$!
run_module() { # dir: vets and tests one module into its log, then prints it
  local dir=$1 rel=${1#"$ROOT"/} log
  log="$logs/$(echo "$rel" | tr / _)"
  (cd "$dir" && go vet ./... && go test -race -count=1 -timeout "$module_timeout" ./...) >"$log" 2>&1
  echo $? >"$log.rc"
  flock "$logs/.print" sh -c 'echo "=== $1"; cat "$2"' _ "$rel" "$log"
}
export -f run_module
export ROOT logs module_timeout
# the longest modules first, so that the lanes end together
slow="examples stores/redisstore tests/outbox tests/model stores/mongostore stores/mysqlstore tools/release tests/robustness tests/rpc"
ordered=()
for rel in $slow; do [ -d "$ROOT/$rel" ] && ordered+=("$ROOT/$rel"); done
for dir in $modules; do
  rel=${dir#"$ROOT"/}
  [ "$rel" = tests/chaos ] && continue
  case " $slow " in *" $rel "*) continue ;; esac
  ordered+=("$dir")
done
printf '%s\n' "${ordered[@]}" | xargs -P "$lanes" -I{} bash -c 'run_module "$1"' _ {}
for dir in "${ordered[@]}"; do
  rel=${dir#"$ROOT"/}
  rc=$(cat "$logs/$(echo "$rel" | tr / _).rc" 2>/dev/null || echo 1)
  [ "$rc" = 0 ] || { echo "make test: $rel failed (its output is above)"; status=1; }
done
echo "=== tests/chaos (ran beside the modules above)"
wait "$chaos_pid" || status=1
cat "$chaos_log"
rm -rf "$logs"

echo "=== benchmarks compile and run once (-benchtime=1x; make bench runs them for real)"
(cd benchmarks && go test -run '^$' -bench . -benchtime=1x -timeout "$module_timeout" ./...) || status=1

echo "=== govulncheck over every module (offline database; IDEM_VULNCHECK=0 skips)"
[ "${IDEM_VULNCHECK:-1}" = 0 ] || ./scripts/vulncheck.sh || status=1

if [ $status -ne 0 ]; then echo "make test: FAILED"; else echo "make test: all modules passed"; fi
exit $status
