package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// problemSlug matches where core builds a problem type: newProblems'
// p("slug", ...) and ProblemTypeBase + "slug".
var problemSlug = regexp.MustCompile(`(?:\bp\(|ProblemTypeBase \+ )"([a-z][a-z-]*)"`)

// coreProblemTypes returns every problem type core's engine can answer,
// read from core's non-test Go files.
func coreProblemTypes(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "core", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var slugs []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range problemSlug.FindAllStringSubmatch(string(b), -1) {
			if !slices.Contains(slugs, m[1]) {
				slugs = append(slugs, m[1])
			}
		}
	}
	slices.Sort(slugs)
	if len(slugs) < 10 || !slices.Contains(slugs, "operation-uncertain") {
		t.Fatalf("found only problem types %q in core/*.go: has newProblems changed form? update problemSlug", slugs)
	}
	return slugs
}

// checkProblemTypes returns what README.md (its Behaviour table) and
// docs/runbook.md (its problem-type table) miss for the problem types.
func checkProblemTypes(readme, runbook string, slugs []string) []string {
	_, behaviour, _ := strings.Cut(readme, "\n## Behaviour\n")
	behaviour, _, _ = strings.Cut(behaviour, "\n## ")
	_, runbookTable, _ := strings.Cut(runbook, "\n## Problem types\n")
	runbookTable, _, _ = strings.Cut(runbookTable, "\n## ")
	var problems []string
	for _, s := range slugs {
		anchor := fmt.Sprintf(`<a id="%s"></a>`, s)
		if !strings.Contains(readme, anchor) {
			problems = append(problems, fmt.Sprintf("problem type %s: README.md has no anchor %s (its type URL is https://github.com/idemkit/idem#%s)", s, anchor, s))
		}
		if !regexp.MustCompile("(?m)^\\|.*\\*\\*[0-9]{3}\\*\\* `" + regexp.QuoteMeta(s) + "`").MatchString(behaviour) {
			problems = append(problems, fmt.Sprintf("problem type %s: README.md's Behaviour table has no row answering **<status>** `%s`", s, s))
		}
		if !regexp.MustCompile("(?m)^\\|[^|]*`" + regexp.QuoteMeta(s) + "`[^|]*\\|").MatchString(runbookTable) {
			problems = append(problems, fmt.Sprintf("problem type %s: docs/runbook.md's Problem types table has no row naming `%s` (say what an operator does about it)", s, s))
		}
	}
	return problems
}

// TestProblemTypesDocumented: every problem type core's engine can answer
// (core/problem.go) has its anchor in README.md, a row of the Behaviour
// table answering it, and a row of the runbook's problem-type table.
func TestProblemTypesDocumented(t *testing.T) {
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	runbook, err := os.ReadFile(filepath.Join(root, "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkProblemTypes(string(readme), string(runbook), coreProblemTypes(t, root)) {
		t.Error(p)
	}
}

// TestProblemTypesDocumentedMissing: a problem type without its anchor,
// row or runbook row is reported, each.
func TestProblemTypesDocumentedMissing(t *testing.T) {
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	runbook, err := os.ReadFile(filepath.Join(root, "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	got := checkProblemTypes(string(readme), string(runbook), []string{"recovery-refused", "brand-new"})
	want := []string{
		"problem type brand-new: README.md has no anchor",
		"problem type brand-new: README.md's Behaviour table has no row",
		"problem type brand-new: docs/runbook.md's Problem types table has no row",
	}
	if len(got) != len(want) {
		t.Fatalf("problems %q; want %d, for brand-new only", got, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("problem %q; want it to start %q", got[i], w)
		}
	}
}
