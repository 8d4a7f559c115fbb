package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/mod/modfile"
)

// repoPrefix is the module path prefix of every module of this repository.
const repoPrefix = "github.com/idemkit/idem/"

// unpublished are the top-level folders whose modules are never tagged:
// runnable examples, benchmarks, test modules and build tools.
var unpublished = map[string]bool{"examples": true, "benchmarks": true, "tests": true, "tools": true}

// module is one go.mod of the repository.
type module struct {
	Dir  string // relative to the repository root, slash-separated ("adapters/idemgin")
	Path string // module path ("github.com/idemkit/idem/adapters/idemgin")
}

// Published reports whether the module is tagged and published: every
// module outside examples/, benchmarks/, tests/ and tools/.
func (m module) Published() bool {
	top, _, _ := strings.Cut(m.Dir, "/")
	return !unpublished[top]
}

// findModules returns every module under root (each folder with a go.mod,
// skipping hidden folders such as .git and .tmp), sorted by folder.
func findModules(root string) ([]module, error) {
	var mods []module
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || d.Name() != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		mp := modfile.ModulePath(data)
		if mp == "" {
			return fmt.Errorf("%s: no module line", path)
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		mods = append(mods, module{Dir: filepath.ToSlash(rel), Path: mp})
		return nil
	})
	sort.Slice(mods, func(i, j int) bool { return mods[i].Dir < mods[j].Dir })
	return mods, err
}

// publishedModules is findModules filtered by [module.Published].
func publishedModules(root string) ([]module, error) {
	all, err := findModules(root)
	if err != nil {
		return nil, err
	}
	var pub []module
	for _, m := range all {
		if m.Published() {
			pub = append(pub, m)
		}
	}
	return pub, nil
}
