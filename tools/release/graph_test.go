package main

import (
	"strings"
	"testing"
)

// A user's module importing one published module has in its module graph
// that module, the modules its build uses and their requirements: no module
// of this repository it does not build with, and no module that only its
// tests need (before the adapters' tests moved to tests/adapters, idemgin
// brought memstore and goleak). Logs the graph sizes.
func TestModuleGraphs(t *testing.T) {
	if testing.Short() {
		t.Skip("tidies a user's module per published module")
	}
	root := repoRoot(t)
	mods, err := publishedModules(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mods {
		rep, err := checkGraph(root, m, mods)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Problems) > 0 {
			t.Errorf("%s", rep)
		} else {
			t.Log(rep)
		}
	}
}

// The check finds a test-only require of this repository: a fake adapter
// whose test imports a fake store.
func TestModuleGraphFindsTestOnlyRequire(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string]string{
		"core/go.mod":  "module github.com/idemkit/idem/core\n\ngo 1.24\n",
		"core/core.go": "package idem\n\n// V is a value.\nconst V = 1\n",
		"stores/s/go.mod": "module github.com/idemkit/idem/stores/s\n\ngo 1.24\n\nrequire github.com/idemkit/idem/core v0.1.0\n\n" +
			"replace github.com/idemkit/idem/core => ../../core\n",
		"stores/s/s.go": "package s\n\nimport idem \"github.com/idemkit/idem/core\"\n\n// V is idem.V.\nconst V = idem.V\n",
		"adapters/a/go.mod": "module github.com/idemkit/idem/adapters/a\n\ngo 1.24\n\nrequire (\n\tgithub.com/idemkit/idem/core v0.1.0\n\tgithub.com/idemkit/idem/stores/s v0.1.0\n)\n\n" +
			"replace github.com/idemkit/idem/core => ../../core\n\nreplace github.com/idemkit/idem/stores/s => ../../stores/s\n",
		"adapters/a/a.go":      "package a\n\nimport idem \"github.com/idemkit/idem/core\"\n\n// V is idem.V.\nconst V = idem.V\n",
		"adapters/a/a_test.go": "package a_test\n\nimport (\n\t\"testing\"\n\n\t\"github.com/idemkit/idem/stores/s\"\n)\n\nfunc TestS(t *testing.T) { _ = s.V }\n",
	})
	mods, err := publishedModules(root)
	if err != nil {
		t.Fatal(err)
	}
	var a module
	for _, m := range mods {
		if m.Dir == "adapters/a" {
			a = m
		}
	}
	rep, err := checkGraph(root, a, mods)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], "github.com/idemkit/idem/stores/s is in the graph but not in the build") {
		t.Errorf("problems %q", rep.Problems)
	}
}
