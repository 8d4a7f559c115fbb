package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/examples/internal/procs"
)

// adapters maps each example to the packages that only it may import: its
// adapter and its framework (module path prefix). Every example is checked
// against the others' entries.
var adapters = map[string][]string{
	"nethttp": {"github.com/idemkit/idem/adapters/idemhttp"},
	"gin":     {"github.com/idemkit/idem/adapters/idemgin", "github.com/gin-gonic/gin"},
	"echo":    {"github.com/idemkit/idem/adapters/idemecho", "github.com/labstack/echo/v4"},
	"echov5":  {"github.com/idemkit/idem/adapters/idemechov5", "github.com/labstack/echo/v5"},
	"fiber":   {"github.com/idemkit/idem/adapters/idemfiber", "github.com/gofiber/fiber/v2"},
	"fiberv3": {"github.com/idemkit/idem/adapters/idemfiberv3", "github.com/gofiber/fiber/v3"},
}

// The examples share one module, so its module graph holds every framework;
// each example's build must still hold only its own adapter and framework,
// as an application copying it would.
func TestExampleImports(t *testing.T) {
	for _, name := range procs.Frameworks {
		own, ok := adapters[name]
		if !ok {
			t.Fatalf("examples/%s has no entry in adapters", name)
		}
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "github.com/idemkit/idem/examples/"+name).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps examples/%s: %v\n%s", name, err, out)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, own[0]) {
			t.Errorf("examples/%s does not import its adapter %s", name, own[0])
		}
		for other, pkgs := range adapters {
			if other == name {
				continue
			}
			for _, p := range pkgs {
				for _, d := range deps {
					if d == p || strings.HasPrefix(d, p+"/") {
						t.Errorf("examples/%s imports %s (%s's)", name, d, other)
					}
				}
			}
		}
	}
}
