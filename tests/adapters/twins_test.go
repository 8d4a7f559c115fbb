package adapters_test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// A twin is code an adapter shares with its sibling for the other major of
// the same framework, kept in both modules (each published module builds on
// its own) and checked here to stay the same: a fix to one must land in the
// other. Names lists the declarations compared (code only, comments
// ignored); Known lists the differences the framework majors force, each
// applied as a textual replacement to the older twin's code before the
// comparison, with its reason. CONTRIBUTING.md ("Framework-major twins")
// says why this is a test and not a generator.
type twin struct {
	older, newer string // files, relative to the repository root
	names        []string
	known        []difference
}

// difference is one replacement; in names the declaration it applies to,
// or "" for all of them.
type difference struct{ in, old, new, why string }

var twins = []twin{
	{
		older: "adapters/idemfiber/idemfiber.go",
		newer: "adapters/idemfiberv3/idemfiberv3.go",
		names: []string{
			"Option", "config", "WithScope", "WithRoute", "WithNext", "outerHeader",
			"contentType", "routeIndex", "leafRoute", "matchedRoute", "newRouteIndex", "recoveryFields",
		},
		known: []difference{
			{"", "*fiber.Ctx", "fiber.Ctx", "v3's Ctx is an interface"},
			{"", `"idemfiber.`, `"idemfiberv3.`, "names in messages"},
			{"", "utils.ToLower(", "utilsstrings.ToLower(", "the lower-casing helper moved to gofiber/utils/v2/strings"},
			{"matchedRoute", "!idx.cfg.CaseSensitive && hasUpper(path)", "!idx.cfg.CaseSensitive",
				"v2's utils.ToLower allocates even for a lower-case path, v3's does not"},
			{"outerHeader", "c.Response().Header.VisitAll(func(k, v []byte) {", "for k, v := range c.Response().Header.All() {",
				"v2 supports fasthttp v1.51, which has no All iterator"},
			{"outerHeader", "\t\t\t\treturn\n", "\t\t\t\tcontinue\n", "the same skip, in a callback and in a loop"},
			{"outerHeader", "\t})\n", "\t}\n", "the end of the callback, the end of the loop"},
		},
	},
	{
		older: "adapters/idemecho/idemecho.go",
		newer: "adapters/idemechov5/idemechov5.go",
		names: []string{"Option", "config", "WithScope", "WithRoute", "WithSkipper", "handledErrorKey", "HandledError"},
		known: []difference{
			{"", "echo.Context", "*echo.Context", "v5's Context is a struct"},
			{"", `"idemecho.`, `"idemechov5.`, "names in messages and context keys"},
		},
	},
}

// TestTwinsInStep fails when the shared code of two framework-major twins
// differs beyond the differences the majors force.
func TestTwinsInStep(t *testing.T) {
	for _, tw := range twins {
		t.Run(filepath.Base(tw.newer), func(t *testing.T) {
			older, newer := decls(t, tw.older), decls(t, tw.newer)
			for _, name := range tw.names {
				o, ok := older[name]
				if !ok {
					t.Errorf("%s: no declaration %s (renamed? update the twin list in this test)", tw.older, name)
					continue
				}
				n, ok := newer[name]
				if !ok {
					t.Errorf("%s: no declaration %s, which %s has", tw.newer, name, tw.older)
					continue
				}
				for _, d := range tw.known {
					if d.in == "" || d.in == name {
						o = strings.ReplaceAll(o, d.old, d.new)
					}
				}
				if o != n {
					t.Errorf("%s differs between the twins beyond the known differences: apply the change to both, "+
						"or add the new framework difference to this test's list with its reason\n--- %s (normalised)\n%s\n--- %s\n%s",
						name, tw.older, o, tw.newer, n)
				}
			}
		})
	}
}

// decls returns the source of each top-level declaration of a file, by name,
// without comments.
func decls(t *testing.T, rel string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join("..", "..", rel), nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	print := func(name string, node any) {
		var b bytes.Buffer
		if err := printer.Fprint(&b, fset, node); err != nil {
			t.Fatal(err)
		}
		out[name] = b.String()
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			d.Doc = nil
			print(d.Name.Name, d)
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					s.Doc, s.Comment = nil, nil
					print(s.Name.Name, s)
				case *ast.ValueSpec:
					s.Doc, s.Comment = nil, nil
					for _, n := range s.Names {
						print(n.Name, s)
					}
				}
			}
		}
	}
	return out
}
