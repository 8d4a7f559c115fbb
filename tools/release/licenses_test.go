package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every published module folder of this repository, and its root, carries a
// LICENSE that licensecheck recognises as one permissive licence.
func TestLicenses(t *testing.T) {
	report, err := checkLicenses(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	mods, err := publishedModules(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(report) != len(mods)+1 || len(mods) < 8 {
		t.Fatalf("checked %d folders for %d published modules: %v", len(report), len(mods), report)
	}
	t.Log(strings.Join(report, "\n"))
}

// A published module without a LICENSE, or with one licensecheck does not
// recognise, is named; an unpublished one (tests/) is not checked.
func TestLicensesMissing(t *testing.T) {
	root := t.TempDir()
	licence, err := os.ReadFile(filepath.Join(repoRoot(t), "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, root, map[string]string{
		"LICENSE":                  string(licence),
		"core/go.mod":              "module github.com/idemkit/idem/core\n",
		"core/LICENSE":             string(licence),
		"adapters/new/go.mod":      "module github.com/idemkit/idem/adapters/new\n",
		"stores/odd/go.mod":        "module github.com/idemkit/idem/stores/odd\n",
		"stores/odd/LICENSE":       "All rights reserved. Ask before use.\n",
		"stores/half/go.mod":       "module github.com/idemkit/idem/stores/half\n",
		"stores/half/LICENSE":      string(licence) + strings.Repeat("Further terms apply to this file and to its use.\n", 30),
		"tests/x/go.mod":           "module github.com/idemkit/idem/tests/x\n",
		"examples/go.mod":          "module github.com/idemkit/idem/examples\n",
		"tools/release/go.mod":     "module github.com/idemkit/idem/tools/release\n",
		"benchmarks/go.mod":        "module github.com/idemkit/idem/benchmarks\n",
		".tmp/cache/x/go.mod":      "module x\n",
		"core/testdata/bad/go.mod": "module bad\n",
	})
	_, err = checkLicenses(root)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"adapters/new: no LICENSE file", "stores/odd: LICENSE: want one licence, licensecheck finds 0", "stores/half: LICENSE: licensecheck recognises"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	for _, not := range []string{"core:", "tests/", "examples", "tools/", "benchmarks", ".tmp", "testdata"} {
		if strings.Contains(err.Error(), not) {
			t.Errorf("error names %q:\n%v", not, err)
		}
	}
}
