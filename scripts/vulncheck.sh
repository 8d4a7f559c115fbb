#!/usr/bin/env bash
# Runs govulncheck (golang.org/x/vuln v1.9.0) over every module of the
# workspace against an offline copy of the Go vulnerability database, since
# vuln.go.dev may be unreachable while the Go module proxy is not: the OSV
# files come from the module golang.org/x/vulndb (its data/osv folder), and
# the vulndb module's own cmd/indexdb turns them into the v1 database that
# `govulncheck -db file://...` reads. Both are built once into .tmp/.
#   IDEM_VULNDB_VERSION   the golang.org/x/vulndb version (a newer one = newer data)
#   IDEM_VULNCHECK_STRICT=1  also fail on standard-library and unfixed findings
# Policy (tools/vulnsummary): a called vulnerability in a required module
# that has a fix fails; standard-library ones (fixed by the toolchain that
# builds the binary) and ones without a fix are printed as warnings.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VULNDB_VERSION=${IDEM_VULNDB_VERSION:-v0.0.0-20261105234957-e22db6528018}
VULN_VERSION=v1.9.0
TMP="$ROOT/.tmp"
DB="$TMP/vulndb/$VULNDB_VERSION"
BIN="$TMP/bin"
mkdir -p "$BIN" "$TMP/vulndb"

if [ ! -x "$BIN/govulncheck-$VULN_VERSION" ]; then
  echo "vulncheck: installing govulncheck $VULN_VERSION"
  GOWORK=off GOFLAGS= GOBIN="$TMP/gobin" go install "golang.org/x/vuln/cmd/govulncheck@$VULN_VERSION"
  mv "$TMP/gobin/govulncheck" "$BIN/govulncheck-$VULN_VERSION"
fi
if [ ! -f "$DB/index/db.json" ]; then
  echo "vulncheck: building the offline vulnerability database from golang.org/x/vulndb@$VULNDB_VERSION (once; about two minutes)"
  work=$(mktemp -d) # `go mod download` and `go run pkg@version` refuse to run inside a git repository without go.mod
  src=$(cd "$work" && GOWORK=off GOFLAGS= go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$src/data/osv" ] || { echo "vulncheck: no data/osv in golang.org/x/vulndb@$VULNDB_VERSION" >&2; exit 1; }
  rm -rf "$DB.tmp"
  (cd "$work" && GOWORK=off GOFLAGS= go run "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION" -vulns "$src/data/osv" -out "$DB.tmp")
  mv "$DB.tmp" "$DB"
  rmdir "$work"
fi

out="$TMP/vulncheck"
rm -rf "$out" && mkdir -p "$out"
status=0
# every module of the workspace; none (GOWORK=off, or no go.work) would check nothing
modules=$(go list -m -f '{{.Dir}}' 2>/dev/null || true)
[ -n "$modules" ] || { echo "vulncheck: go list -m found no module of the workspace (GOWORK=$(go env GOWORK)); nothing would be checked" >&2; exit 1; }
# One run over the packages of every module (the workspace's versions, as
# a run in each module's folder also resolves them): the standard library
# and the shared dependencies are analysed once, not once per module.
# govulncheck wants a go.mod in its folder, hence -C core.
patterns=()
for dir in $modules; do patterns+=("$dir/..."); done
"$BIN/govulncheck-$VULN_VERSION" -C "$ROOT/core" -db "file://$DB" -format json "${patterns[@]}" >"$out/workspace.json" 2>"$out/workspace.err" \
  || { echo "vulncheck: govulncheck failed:"; cat "$out/workspace.err"; status=1; }
strict=()
[ "${IDEM_VULNCHECK_STRICT:-}" = 1 ] && strict=(-strict)
GOWORK=off go run tools/vulnsummary/main.go "${strict[@]}" "$out"/*.json || status=1
exit $status
