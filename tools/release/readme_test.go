package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// readmeList is one of README.md's lists of modules: the text from the
// first start marker to the first end marker after it (for the replace
// loop, its "for m in" line, expanded by bash).
type readmeList struct {
	name       string
	start, end string
	loop       bool              // the copy-an-example recipe's `for m in ...; do` line
	want       func(module) bool // the published modules it must name
	only       bool              // it names no module of the repository but those
}

// library reports whether m is imported by programs: every published
// module but the commands under cmd/.
func library(m module) bool { return !strings.HasPrefix(m.Dir, "cmd/") }

func every(module) bool { return true }

var readmeLists = []readmeList{
	{name: "intro's module list", start: "go get github.com/idemkit/idem/core", end: "Each is its own module", want: every, only: true},
	{name: "Layout table", start: "## Layout", end: "Import paths:", want: every},
	{name: "import paths", start: "Import paths:", end: "Each is its own module", want: library, only: true},
	{name: "published modules (Versions and Go support)", start: ": today ", end: "(`go run ./tools/release modules`", want: every, only: true},
	{name: "replace loop of \"Running an example as your own module\"", start: "<!-- example-install:", loop: true, want: library, only: true},
}

// TestReadmeModuleLists: each list of modules in README.md names every
// module the release tool publishes (go run . modules), so that a new
// module cannot be left out of the front page, the Layout, the import
// paths, the published list or the replace loop a copied example needs.
func TestReadmeModuleLists(t *testing.T) {
	readme, all, published := readmeAndModules(t)
	for _, p := range checkReadmeLists(t, readme, all, published) {
		t.Error(p)
	}
}

// TestReadmeModuleListsMissing: a published module the README does not
// name is reported in every list, and a list that may name only published
// modules reports one that is not.
func TestReadmeModuleListsMissing(t *testing.T) {
	readme, all, published := readmeAndModules(t)
	newcomer := module{Dir: "adapters/idemnew", Path: repoPrefix + "adapters/idemnew"}
	problems := checkReadmeLists(t, readme, append(all, newcomer), append(published, newcomer))
	for _, l := range readmeLists {
		want := fmt.Sprintf("README.md's %s does not name adapters/idemnew", l.name)
		if !slices.Contains(problems, want) {
			t.Errorf("no problem %q in %q", want, problems)
		}
	}
	// outbox as if it were unpublished: the exclusive lists name it wrongly.
	var fewer []module
	for _, m := range published {
		if m.Dir != "outbox" {
			fewer = append(fewer, m)
		}
	}
	problems = checkReadmeLists(t, readme, all, fewer)
	for _, l := range readmeLists {
		want := fmt.Sprintf("README.md's %s names outbox, which it should not", l.name)
		if got := slices.Contains(problems, want); got != l.only {
			t.Errorf("problem %q reported %v, want %v (problems %q)", want, got, l.only, problems)
		}
	}
}

// readmeAndModules returns README.md, every module of the repository and
// the published ones.
func readmeAndModules(t *testing.T) (readme string, all, published []module) {
	t.Helper()
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if all, err = findModules(root); err != nil {
		t.Fatal(err)
	}
	if published, err = publishedModules(root); err != nil {
		t.Fatal(err)
	}
	return string(b), all, published
}

// checkReadmeLists returns what README.md's lists miss or name wrongly, for
// the repository's modules all and the published ones.
func checkReadmeLists(t *testing.T, readme string, all, published []module) []string {
	t.Helper()
	var problems []string
	for _, l := range readmeLists {
		named, err := l.modules(readme, all)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		for _, m := range published {
			if l.want(m) && !named[m.Dir] {
				problems = append(problems, fmt.Sprintf("README.md's %s does not name %s", l.name, m.Dir))
			}
		}
		if !l.only {
			continue
		}
		for _, m := range all {
			if named[m.Dir] && !slices.ContainsFunc(published, func(p module) bool { return p.Dir == m.Dir && l.want(p) }) {
				problems = append(problems, fmt.Sprintf("README.md's %s names %s, which it should not", l.name, m.Dir))
			}
		}
	}
	return problems
}

// moduleRef matches a backquoted span or an import path of this repository.
var moduleRef = regexp.MustCompile("`([^`]+)`|github\\.com/idemkit/idem/([a-z0-9_/]+)")

// modules returns the folders of the modules of all that l names. README
// lists shorten a run of siblings to their last element after the first
// (`adapters/idemhttp`, `idemgin`): a bare name is the sibling of the last
// folder named when that module exists, else a top-level module.
func (l readmeList) modules(readme string, all []module) (map[string]bool, error) {
	_, text, ok := strings.Cut(readme, l.start)
	if !ok {
		return nil, fmt.Errorf("README.md's %s: no %q", l.name, l.start)
	}
	exists := map[string]bool{}
	for _, m := range all {
		exists[m.Dir] = true
	}
	named := map[string]bool{}
	if l.loop {
		_, line, ok := strings.Cut(text, "\nfor m in ")
		words, _, ok2 := strings.Cut(line, "; do")
		if !ok || !ok2 {
			return nil, fmt.Errorf("README.md's %s: no `for m in ...; do` line", l.name)
		}
		out, err := exec.Command("bash", "-c", "printf '%s\\n' "+words).Output()
		if err != nil {
			return nil, fmt.Errorf("README.md's %s: bash expanding %q: %w", l.name, words, err)
		}
		for _, dir := range strings.Fields(string(out)) {
			named[dir] = true
			if !exists[dir] {
				return nil, fmt.Errorf("README.md's %s names %s, which is no module of the repository", l.name, dir)
			}
		}
		return named, nil
	}
	text, _, ok = strings.Cut(text, l.end)
	if !ok {
		return nil, fmt.Errorf("README.md's %s: no %q after %q", l.name, l.end, l.start)
	}
	// the start marker may name a module; a code fence is no span
	text = strings.ReplaceAll(l.start+text, "```", "\n")
	folder := ""
	for _, m := range moduleRef.FindAllStringSubmatch(text, -1) {
		ref := m[2]
		if span := m[1]; span != "" {
			ref = span
			if _, path, ok := strings.Cut(span, repoPrefix); ok {
				ref = strings.Trim(path, `"`)
			}
		}
		ref = strings.TrimSuffix(ref, "/")
		dir := ref
		if !strings.Contains(ref, "/") && exists[folder+"/"+ref] {
			dir = folder + "/" + ref
		}
		if strings.Contains(dir, "/") {
			folder = filepath.ToSlash(filepath.Dir(dir))
		}
		if exists[dir] {
			named[dir] = true
		}
	}
	return named, nil
}

// goDocRef matches a `go doc ./folder Symbol` command of README.md.
var goDocRef = regexp.MustCompile("`go doc (\\./[a-z0-9_/]+) ([A-Za-z_][A-Za-z0-9_.]*)`")

// TestReadmeGoDoc runs each `go doc ./folder Symbol` README.md shows, from
// the root of the checkout as it says, and checks that it prints the
// symbol's declaration.
func TestReadmeGoDoc(t *testing.T) {
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := goDocRef.FindAllStringSubmatch(string(readme), -1)
	if len(cmds) == 0 {
		t.Fatal("README.md shows no `go doc ./folder Symbol` command")
	}
	for _, c := range cmds {
		cmd := exec.Command("go", "doc", c[1], c[2])
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		name := c[2][strings.LastIndex(c[2], ".")+1:] // a method's own name
		decl := regexp.MustCompile(`(?m)^(func|type|const|var) (\([^)]*\) )?` + regexp.QuoteMeta(name) + `\b`)
		if err != nil || !decl.Match(out) {
			t.Errorf("go doc %s %s from the root: %v\n%s", c[1], c[2], err, out)
		}
	}
}
