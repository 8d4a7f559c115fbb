#!/usr/bin/env bash
# Tags every published module (each go.mod outside examples/, benchmarks/,
# tests/ and tools/) at one version: <folder>/vX.Y.Z.
#   scripts/release.sh --dry-run v0.2.0                 checks and prints the plan; changes nothing
#   scripts/release.sh --dry-run --skip-tests v0.2.0    the same without make test
#   scripts/release.sh v0.2.0                           the release: commits the requires, creates the tags
# Steps (tools/release, release.go): the version is vX.Y.Z with major v0 or
# v1 and no tag of it exists; the work tree is clean; make test passes; every
# in-repo require in every go.mod is rewritten to the version; each published
# module is verified in a copy of HEAD carrying the rewrites (it builds on its
# own with GOWORK=off, and a user's module requiring it at the version, with
# the published modules at exactly that version taken from their folders,
# tidies and builds); then the rewrites are committed and the tags created
# (annotated, not pushed: the last line prints the git push command).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT/tools/release"
GOWORK=off go run . tag -root "$ROOT" "$@"
