// Command release holds the release checks and tooling of the idem
// repository: the licence check (every published module folder carries a
// LICENSE that github.com/google/licensecheck, the library pkg.go.dev uses,
// recognises), the module-graph check (a user's module importing one
// published module pulls in no test-only requirement of it) and the tagging
// of every published module at one version (scripts/release.sh). Its tests
// run all three against the repository in make test.
//
// A published module is every go.mod outside examples/, benchmarks/, tests/
// and tools/; each is tagged <folder>/vX.Y.Z (core/v0.2.0,
// adapters/idemgin/v0.2.0, ...).
package main
