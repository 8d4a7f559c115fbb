package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// repoRoot is the root of the repository this test runs in.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := run(dir, os.Environ(), "git", args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// writeFiles writes files (slash paths relative to dir → content).
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// The published modules and their tags, computed here independently from
// the tool: every go.mod git tracks outside examples/, benchmarks/,
// tests/ and tools/.
func wantTags(t *testing.T, root, version string) []string {
	var tags []string
	for _, f := range lines(git(t, root, "ls-files", "--", "*go.mod", "go.mod")) {
		dir := strings.TrimSuffix(strings.TrimSuffix(f, "go.mod"), "/")
		switch strings.SplitN(dir, "/", 2)[0] {
		case "examples", "benchmarks", "tests", "tools":
			continue
		}
		tags = append(tags, dir+"/"+version)
	}
	sort.Strings(tags)
	return tags
}

// scripts/release.sh --dry-run on a fresh clone of this commit lists one tag
// per published module, verifies them, and leaves the clone as it was: no
// changed file, no tag, the same HEAD.
func TestReleaseDryRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every published module from a user's module")
	}
	clone := filepath.Join(t.TempDir(), "idem")
	git(t, repoRoot(t), "clone", "--quiet", "--no-local", repoRoot(t), clone)
	head := git(t, clone, "rev-parse", "HEAD")

	// With tests, as CONTRIBUTING documents it, except that make is a
	// stand-in recording what make test would see (the real one runs this
	// test): the workspace and its modules, not release.sh's GOWORK=off.
	shim, seen := t.TempDir(), filepath.Join(t.TempDir(), "make-test-env")
	writeFiles(t, shim, map[string]string{"make": "#!/bin/sh\n{ go env GOWORK; go list -m | wc -l; } >" + seen + " 2>&1\n"})
	if err := os.Chmod(filepath.Join(shim, "make"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "scripts/release.sh", "--dry-run", "v0.2.0")
	cmd.Dir = clone
	cmd.Env = append(os.Environ(), "GOFLAGS=", "PATH="+shim+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("release.sh --dry-run: %v\n%s", err, out)
	}
	env, err := os.ReadFile(seen)
	if err != nil {
		t.Fatalf("make test did not run: %v\n%s", err, out)
	}
	if f := strings.Fields(string(env)); len(f) != 2 || f[0] != filepath.Join(clone, "go.work") || f[1] == "0" {
		t.Errorf("make test saw GOWORK and module count %q, want %s and every module", env, filepath.Join(clone, "go.work"))
	}
	var tags []string
	for _, l := range lines(string(out)) {
		if tag, ok := strings.CutPrefix(l, "tag "); ok {
			tags = append(tags, tag)
		}
	}
	sort.Strings(tags)
	want := wantTags(t, clone, "v0.2.0")
	if strings.Join(tags, " ") != strings.Join(want, " ") {
		t.Errorf("tags:\n got %v\nwant %v\n%s", tags, want, out)
	}
	for _, must := range []string{"core/v0.2.0", "adapters/idemgin/v0.2.0", "stores/memstore/v0.2.0"} {
		if !strings.Contains(string(out), "tag "+must+"\n") {
			t.Errorf("no tag %s in:\n%s", must, out)
		}
	}
	if !strings.Contains(string(out), "require adapters/idemgin/go.mod: github.com/idemkit/idem/core v0.1.0 => v0.2.0") {
		t.Errorf("the plan lacks idemgin's core require:\n%s", out)
	}
	for _, m := range want {
		if !strings.Contains(string(out), "verified "+strings.TrimSuffix(m, "/v0.2.0")+":") {
			t.Errorf("%s not verified:\n%s", m, out)
		}
	}
	if s := git(t, clone, "status", "--porcelain", "--ignored"); s != "" {
		t.Errorf("dry run changed the tree:\n%s", s)
	}
	if tags := git(t, clone, "tag", "--list"); tags != "" {
		t.Errorf("dry run created tags:\n%s", tags)
	}
	if h := git(t, clone, "rev-parse", "HEAD"); h != head {
		t.Errorf("dry run moved HEAD from %s to %s", head, h)
	}
}

// A fake repository: two published modules, one tests module, in a fresh
// git repository with one commit.
func fakeRepo(t *testing.T) string {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"core/go.mod":  "module github.com/idemkit/idem/core\n\ngo 1.24\n",
		"core/core.go": "package idem\n\n// V is a value.\nconst V = 1\n",
		"adapters/a/go.mod": "module github.com/idemkit/idem/adapters/a\n\ngo 1.24\n\nrequire github.com/idemkit/idem/core v0.1.0\n\n" +
			"replace github.com/idemkit/idem/core => ../../core\n",
		"adapters/a/a.go":   "package a\n\nimport idem \"github.com/idemkit/idem/core\"\n\n// V is idem.V.\nconst V = idem.V\n",
		"tests/x/go.mod":    "module github.com/idemkit/idem/tests/x\n\ngo 1.24\n\nrequire github.com/idemkit/idem/core v0.1.0\n\nreplace github.com/idemkit/idem/core => ../../core\n",
		"tests/x/x_test.go": "package x\n",
	})
	git(t, dir, "init", "--quiet")
	git(t, dir, "add", ".")
	git(t, dir, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "--quiet", "-m", "init")
	return dir
}

// The real run on a fake repository: requires rewritten (tests/ too),
// committed, one annotated tag per published module.
func TestReleaseTags(t *testing.T) {
	dir := fakeRepo(t)
	var out strings.Builder
	// make test of the fake repository: a Makefile whose test target passes
	writeFiles(t, dir, map[string]string{
		"Makefile":     "test:\n\t@echo fake make test\n",
		"CHANGELOG.md": "# Changelog\n\n## [Unreleased]\n\n## [0.3.0] - 2026-12-01\n",
	})
	git(t, dir, "add", ".")
	git(t, dir, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "--quiet", "-m", "make")
	t.Setenv("GIT_AUTHOR_NAME", "t")
	t.Setenv("GIT_AUTHOR_EMAIL", "t@example.com")
	t.Setenv("GIT_COMMITTER_NAME", "t")
	t.Setenv("GIT_COMMITTER_EMAIL", "t@example.com")
	if err := release(releaseOptions{Root: dir, Version: "v0.3.0", Out: &out}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "fake make test") {
		t.Errorf("make test did not run:\n%s", out.String())
	}
	if got := strings.Join(lines(git(t, dir, "tag", "--list")), " "); got != "adapters/a/v0.3.0 core/v0.3.0" {
		t.Errorf("tags %q", got)
	}
	for _, f := range []string{"adapters/a/go.mod", "tests/x/go.mod"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), "github.com/idemkit/idem/core v0.3.0") {
			t.Errorf("%s not rewritten:\n%s", f, data)
		}
	}
	if s := git(t, dir, "status", "--porcelain"); s != "" {
		t.Errorf("release left changes:\n%s", s)
	}
	if msg := git(t, dir, "log", "-1", "--format=%s", "core/v0.3.0"); !strings.Contains(msg, "in-repo requires at v0.3.0") {
		t.Errorf("tag on commit %q", msg)
	}
	// a second release of the same version is refused
	if err := release(releaseOptions{Root: dir, Version: "v0.3.0", DryRun: true, SkipTests: true, Out: &out}); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Errorf("second v0.3.0: %v", err)
	}
}

func TestReleaseRefuses(t *testing.T) {
	dir := fakeRepo(t)
	var out strings.Builder
	for _, tc := range []struct {
		name string
		o    releaseOptions
		want string
	}{
		{"bad version", releaseOptions{Version: "0.2.0", DryRun: true, SkipTests: true}, "want vMAJOR.MINOR.PATCH"},
		{"short version", releaseOptions{Version: "v0.2", DryRun: true, SkipTests: true}, "want vMAJOR.MINOR.PATCH"},
		{"major 2", releaseOptions{Version: "v2.0.0", DryRun: true, SkipTests: true}, "/v2 module paths"},
		{"skip tests for real", releaseOptions{Version: "v0.2.0", SkipTests: true}, "only with --dry-run"},
		{"no changelog section", releaseOptions{Version: "v0.2.0"}, "CHANGELOG.md"},
	} {
		tc.o.Root, tc.o.Out = dir, &out
		if err := release(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	writeFiles(t, dir, map[string]string{"core/new.go": "package idem\n"})
	err := release(releaseOptions{Root: dir, Version: "v0.2.0", DryRun: true, SkipTests: true, Out: &out})
	if err == nil || !strings.Contains(err.Error(), "not clean") || !strings.Contains(err.Error(), "core/new.go") {
		t.Errorf("dirty tree: %v", err)
	}
}

// A command module with replace directives cannot be installed with
// go install path@version; a library module can keep them.
func TestInstallWarning(t *testing.T) {
	dir := fakeRepo(t)
	writeFiles(t, dir, map[string]string{
		"cmd/tool/go.mod": "module github.com/idemkit/idem/cmd/tool\n\ngo 1.24\n\nrequire github.com/idemkit/idem/core v0.1.0\n\n" +
			"replace github.com/idemkit/idem/core => ../../core\n",
		"cmd/tool/main.go": "package main\n\nimport idem \"github.com/idemkit/idem/core\"\n\nfunc main() { println(idem.V) }\n",
	})
	warn, err := installWarning(filepath.Join(dir, "cmd/tool"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(warn, "go install github.com/idemkit/idem/cmd/tool@VERSION will refuse it") {
		t.Errorf("command with replace: %q", warn)
	}
	if warn, err := installWarning(filepath.Join(dir, "adapters/a")); err != nil || warn != "" {
		t.Errorf("library with replace: %q, %v", warn, err)
	}
}
