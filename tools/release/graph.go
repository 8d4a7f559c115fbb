package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// graphAllowance names third-party modules a published module may require
// for its tests only, by folder prefix, with the reason.
var graphAllowance = map[string]map[string]string{
	"stores/": {
		// The stores' tests check for leaked goroutines in TestMain. A
		// consumer's pruned graph holds goleak as one node without its own
		// requirements; moving every store's tests out (as the adapters'
		// were, to tests/adapters) would remove it.
		"go.uber.org/goleak": "store tests check goroutine leaks",
	},
	"client/": {
		// idemclient's unit tests check that no attempt, timer or
		// connection goroutine outlives a call, as the stores' do.
		"go.uber.org/goleak": "client tests check goroutine leaks",
	},
}

// graphReport is what checkGraph measured for one published module.
type graphReport struct {
	Module   module
	Edges    int      // lines of `go mod graph`
	Nodes    int      // distinct module@version in it
	Paths    int      // distinct module paths in it
	Problems []string // modules in the graph that only a test of Module needs
	Command  bool     // no importable package: users go install it, nothing imports it
}

func (r graphReport) String() string {
	if r.Command {
		return fmt.Sprintf("%s: a command (no importable package): nothing to check", r.Module.Dir)
	}
	s := fmt.Sprintf("%s: consumer graph %d edges, %d module versions, %d module paths", r.Module.Dir, r.Edges, r.Nodes, r.Paths)
	if len(r.Problems) > 0 {
		s += "\n  " + strings.Join(r.Problems, "\n  ")
	}
	return s
}

// checkGraph writes, in a temporary folder, a user's module that imports
// every importable package of mod and nothing else, with every published
// module of root replaced by its folder (as a user would get them from the
// proxy once tagged), runs go mod tidy and go mod graph, and reports each
// module of the graph that is there only because mod requires it for its
// tests: a module of this repository that the build does not use, or a
// module path that mod alone requires and the build does not use (such as
// memstore or goleak in an adapter's go.mod).
func checkGraph(root string, mod module, published []module) (graphReport, error) {
	rep := graphReport{Module: mod}
	root, err := filepath.Abs(root)
	if err != nil {
		return rep, err
	}
	dir, err := os.MkdirTemp("", "idem-consumer-")
	if err != nil {
		return rep, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	pkgs, err := importablePackages(filepath.Join(root, mod.Dir))
	if err != nil {
		return rep, err
	}
	if len(pkgs) == 0 {
		rep.Command = true
		return rep, nil
	}
	replace := map[string]string{}
	for _, p := range published {
		replace[p.Path] = filepath.Join(root, p.Dir)
	}
	if err := writeConsumer(dir, mod, "v0.0.0", pkgs, replace); err != nil {
		return rep, err
	}
	if _, err := goRun(dir, "mod", "tidy"); err != nil {
		return rep, err
	}
	graph, err := goRun(dir, "mod", "graph")
	if err != nil {
		return rep, err
	}
	deps, err := goRun(dir, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "./...")
	if err != nil {
		return rep, err
	}
	built := map[string]bool{}
	for _, p := range lines(deps) {
		built[p] = true
	}
	pathOf := func(node string) string { p, _, _ := strings.Cut(node, "@"); return p }
	nodes, paths := map[string]bool{}, map[string]bool{}
	requiredByOthers := map[string]bool{} // paths some module other than mod and the consumer requires
	requiredByMod := map[string]bool{}
	for _, edge := range lines(graph) {
		from, to, ok := strings.Cut(edge, " ")
		if !ok {
			return rep, fmt.Errorf("go mod graph: unexpected line %q", edge)
		}
		rep.Edges++
		for _, n := range []string{from, to} {
			if pathOf(n) == "go" || pathOf(n) == "toolchain" {
				continue
			}
			nodes[n], paths[pathOf(n)] = true, true
		}
		switch pathOf(from) {
		case consumerPath:
		case mod.Path:
			requiredByMod[pathOf(to)] = true
		default:
			requiredByOthers[pathOf(to)] = true
		}
	}
	rep.Nodes, rep.Paths = len(nodes), len(paths)
	allowed := map[string]string{}
	for prefix, a := range graphAllowance {
		if strings.HasPrefix(mod.Dir, prefix) {
			allowed = a
		}
	}
	for p := range paths {
		switch {
		case p == consumerPath || p == mod.Path || built[p]:
		case strings.HasPrefix(p, repoPrefix):
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s is in the graph but not in the build (a test-only require of %s?)", p, mod.Dir))
		case requiredByMod[p] && !requiredByOthers[p] && allowed[p] == "":
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s is required only by %s and not used by its build (a test-only require?)", p, mod.Dir))
		}
	}
	sort.Strings(rep.Problems)
	return rep, nil
}
