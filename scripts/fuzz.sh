#!/usr/bin/env bash
# `make fuzz`: runs every Fuzz target of every module in the workspace with
# `go test -fuzz` for FUZZTIME each (default 20s; any `go test -fuzztime`
# value, e.g. 2m or 10000x). New failing inputs land in the package's
# testdata/fuzz/<Target>/ and become seeds that plain `go test` (and so
# `make test`) replays; commit them with the fix.
#   FUZZTIME=1m make fuzz
#   FUZZ_MATCH=FuzzHTTP make fuzz   # only targets whose name matches this regexp
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
FUZZTIME=${FUZZTIME:-20s}
FUZZ_MATCH=${FUZZ_MATCH:-.}

status=0
ran=0
for dir in $(go list -m -f '{{.Dir}}'); do
  while read -r pkg pdir; do
    [ -n "$pkg" ] || continue
    for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$pdir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
      [[ $target =~ $FUZZ_MATCH ]] || continue
      echo "=== $pkg $target ($FUZZTIME)"
      ran=$((ran + 1))
      (cd "$dir" && go test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$pkg") || status=1
    done
  done < <(cd "$dir" && go list -f '{{.ImportPath}} {{.Dir}}' ./...)
done

echo "make fuzz: $ran targets, $FUZZTIME each"
if [ $status -ne 0 ]; then echo "make fuzz: FAILED (failing inputs are in testdata/fuzz/)"; fi
exit $status
