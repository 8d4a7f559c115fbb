#!/usr/bin/env bash
# `make lint`: golangci-lint v2 (configuration in .golangci.yml at the root)
# over every module of the workspace, and actionlint over the GitHub Actions
# workflows in .github/workflows. Installs both into .tmp/bin the first time.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VERSION=v2.15.0
BIN="$ROOT/.tmp/bin/golangci-lint-$VERSION"
if [ ! -x "$BIN" ]; then
  echo "lint: installing golangci-lint $VERSION (once; a few minutes)"
  mkdir -p "$ROOT/.tmp/bin"
  (cd "$(mktemp -d)" && GOWORK=off GOFLAGS= GOBIN="$ROOT/.tmp/gobin" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$VERSION")
  mv "$ROOT/.tmp/gobin/golangci-lint" "$BIN"
fi
status=0
for dir in $(go list -m -f '{{.Dir}}'); do
  echo "=== ${dir#"$ROOT"/}"
  # --allow-serial-runners: wait for another golangci-lint on this machine instead of failing
  (cd "$dir" && "$BIN" run --allow-serial-runners --config "$ROOT/.golangci.yml" ./...) || status=1
done
ACTIONLINT_VERSION=v1.7.12 # github.com/rhysd/actionlint
ACTIONLINT="$ROOT/.tmp/bin/actionlint-$ACTIONLINT_VERSION"
if [ ! -x "$ACTIONLINT" ]; then
  echo "lint: installing actionlint $ACTIONLINT_VERSION"
  mkdir -p "$ROOT/.tmp/bin"
  (cd "$(mktemp -d)" && GOWORK=off GOFLAGS= GOBIN="$ROOT/.tmp/gobin" go install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION")
  mv "$ROOT/.tmp/gobin/actionlint" "$ACTIONLINT"
fi
echo "=== .github/workflows (actionlint)"
"$ACTIONLINT" -no-color || status=1

if [ $status -ne 0 ]; then echo "make lint: findings above"; else echo "make lint: clean"; fi
exit $status
