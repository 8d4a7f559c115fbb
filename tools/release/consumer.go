package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// consumerPath is the module path of the consumer modules written here.
const consumerPath = "example.com/consumer"

// importablePackages lists the packages of the module in dir that a user can
// import: not internal, not main (go list ./..., GOWORK=off).
func importablePackages(dir string) ([]string, error) {
	out, err := goRun(dir, "list", "-f", "{{if ne .Name \"main\"}}{{.ImportPath}}{{end}}", "./...")
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for _, p := range lines(out) {
		if !strings.Contains(p+"/", "/internal/") {
			pkgs = append(pkgs, p)
		}
	}
	return pkgs, nil
}

// writeConsumer writes into dir (empty) a user's module that requires
// mod at version and imports every package in pkgs, with one replace
// directive per entry of replace ("path" or "path vX.Y.Z" → folder).
func writeConsumer(dir string, mod module, version string, pkgs []string, replace map[string]string) error {
	var gomod strings.Builder
	fmt.Fprintf(&gomod, "module %s\n\ngo 1.24\n\nrequire %s %s\n\n", consumerPath, mod.Path, version)
	for from, to := range replace {
		fmt.Fprintf(&gomod, "replace %s => %s\n", from, to)
	}
	var main strings.Builder
	main.WriteString("package main\n\nimport (\n")
	for _, p := range pkgs {
		fmt.Fprintf(&main, "\t_ %q\n", p)
	}
	main.WriteString(")\n\nfunc main() {}\n")
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod.String()), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "main.go"), []byte(main.String()), 0o600)
}
