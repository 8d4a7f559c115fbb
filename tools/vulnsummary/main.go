// Command vulnsummary reads the JSON output of `govulncheck -format json`
// (one or more files) and prints the vulnerabilities the code calls, one
// line each. It exits 1 when a called vulnerability lives in a required
// module that has a fixed version (actionable: upgrade it), or, with
// -strict, when any vulnerability is called. Called vulnerabilities in the
// standard library (fixed by upgrading the Go toolchain that builds the
// binary, which is the user's) and in modules without a fix are warnings.
// Vulnerabilities in imported code that is never called are only counted.
// Each line names the modules of this repository whose code the findings'
// call traces enter from (govulncheck reports representative traces, so
// these are examples, not every caller), or the file's name when a trace
// enters from elsewhere.
//
//	go run tools/vulnsummary/main.go [-strict] module1.json module2.json ...
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type frame struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Package  string `json:"package"`
	Function string `json:"function"`
	Receiver string `json:"receiver"`
}

type message struct {
	Config *struct {
		DB        string `json:"db"`
		GoVersion string `json:"go_version"`
	} `json:"config"`
	OSV *struct {
		ID      string `json:"id"`
		Summary string `json:"summary"`
	} `json:"osv"`
	Finding *struct {
		OSV          string  `json:"osv"`
		FixedVersion string  `json:"fixed_version"`
		Trace        []frame `json:"trace"`
	} `json:"finding"`
}

// repoModule is the module path prefix of this repository's modules.
const repoModule = "github.com/idemkit/idem"

type called struct {
	id, module, version, fixed, symbol, where string
}

func main() {
	strict := flag.Bool("strict", false, "fail on every called vulnerability, standard library and unfixed ones included")
	flag.Parse()
	summaries := map[string]string{}
	calls := map[string]called{} // by caller + id
	uncalled := map[string]bool{}
	goVersion := ""
	for _, path := range flag.Args() {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "vulnsummary:", err)
			os.Exit(2)
		}
		dec := json.NewDecoder(f)
		for {
			var m message
			if err := dec.Decode(&m); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				fmt.Fprintf(os.Stderr, "vulnsummary: %s: %v\n", path, err)
				os.Exit(2)
			}
			switch {
			case m.Config != nil:
				goVersion = m.Config.GoVersion
			case m.OSV != nil:
				summaries[m.OSV.ID] = m.OSV.Summary
			case m.Finding != nil && len(m.Finding.Trace) > 0:
				top := m.Finding.Trace[0]
				if top.Function == "" {
					uncalled[m.Finding.OSV] = true
					continue
				}
				where := strings.TrimSuffix(filepath.Base(path), ".json")
				if entry := m.Finding.Trace[len(m.Finding.Trace)-1].Module; strings.HasPrefix(entry, repoModule+"/") {
					where = strings.TrimPrefix(entry, repoModule+"/")
				}
				key := where + " " + m.Finding.OSV
				if _, ok := calls[key]; ok {
					continue
				}
				sym := top.Package + "." + top.Function
				if top.Receiver != "" {
					sym = top.Package + "." + strings.TrimPrefix(top.Receiver, "*") + "." + top.Function
				}
				calls[key] = called{id: m.Finding.OSV, module: top.Module, version: top.Version,
					fixed: m.Finding.FixedVersion, symbol: sym, where: where}
			}
		}
		f.Close()
	}
	// One line per vulnerability and module version, naming the modules
	// that call it.
	type group struct {
		c     called
		where []string
	}
	groups := map[string]*group{}
	for _, c := range calls {
		k := c.id + " " + c.module + "@" + c.version
		if groups[k] == nil {
			groups[k] = &group{c: c}
		}
		groups[k].where = append(groups[k].where, c.where)
		delete(uncalled, c.id)
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fail, stdlib := 0, map[string]bool{}
	for _, k := range keys {
		g := groups[k]
		c := g.c
		sort.Strings(g.where)
		level := "WARN"
		switch {
		case *strict, c.module != "stdlib" && c.fixed != "":
			level = "FAIL"
			fail++
		case c.module == "stdlib":
			stdlib[c.id] = true
		}
		fix := "no fixed version"
		if c.fixed != "" {
			fix = "fixed in " + c.fixed
		}
		fmt.Printf("%s %s %s@%s (%s): %s\n    called from %s (e.g. %s)\n", level, c.id, c.module, c.version, fix, summaries[c.id], strings.Join(g.where, ", "), c.symbol)
	}
	fmt.Printf("vulncheck: %d called vulnerabilities (%d failing, %d in the standard library of %s), %d more in code that is imported but not called\n",
		len(groups), fail, len(stdlib), goVersion, len(uncalled))
	if len(stdlib) > 0 && !*strict {
		fmt.Printf("vulncheck: standard-library findings are fixed by building with a newer Go toolchain than %s; they do not fail the check\n", goVersion)
	}
	if fail > 0 {
		os.Exit(1)
	}
}
