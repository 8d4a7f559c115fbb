package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// copyable lists the example folders that are complete programs: every
// folder of examples/ but demo (a test driver built on examples/internal),
// payments (the full service, built on examples/internal/payments) and
// internal.
func copyable(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("..")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "demo" || e.Name() == "payments" || e.Name() == "internal" {
			continue
		}
		if _, err := os.Stat(filepath.Join("..", e.Name(), "go.mod")); err == nil {
			continue // its own module (webhooks, mcp): copied as it is
		}
		names = append(names, e.Name())
	}
	return names
}

// TestFrameworkExamplesShort: each framework's example is one short program
// (one store, one handler, graceful shutdown) a reader takes in at a
// glance: one Go file under 200 lines, besides generated code.
func TestFrameworkExamplesShort(t *testing.T) {
	for _, name := range []string{"nethttp", "gin", "echo", "echov5", "fiber", "fiberv3", "grpc"} {
		files, err := filepath.Glob(filepath.Join("..", name, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		var programs []string
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") || filepath.Base(f) == "gen.go" {
				continue
			}
			programs = append(programs, filepath.Base(f))
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(b, []byte("\n")); n >= 200 {
				t.Errorf("examples/%s/%s: %d lines, want under 200", name, filepath.Base(f), n)
			}
		}
		if len(programs) != 1 || programs[0] != "main.go" {
			t.Errorf("examples/%s: Go files %v, want one main.go", name, programs)
		}
	}
}

// TestExamplesCopyable follows the README's recipe for running an example
// as your own module, against this checkout, for every copyable example at
// once: each folder is copied, without its tests, into one fresh module
// (named as the grpc example's generated code is imported, as the recipe
// says for grpc), the recipe points the idem modules at the checkout and
// tidies, and go vet compiles and checks every package (the examples'
// own tests run the same sources as services). An example that imports anything of the
// examples module (examples/internal) fails here: its copy has no such
// package.
func TestExamplesCopyable(t *testing.T) {
	script := readmeBlock(t, "<!-- example-install:")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	names := copyable(t)
	for _, r := range [][2]string{
		{"IDEM=$HOME/src/idem", "IDEM=" + root},
		{"cp -R $IDEM/examples/gin payments && cd payments && rm -f *_test.go",
			"mkdir payments && for e in " + strings.Join(names, " ") + "; do cp -R $IDEM/examples/$e payments/; done && cd payments && find . -name '*_test.go' -delete"},
		{"go mod init example.com/payments", "go mod init github.com/idemkit/idem/examples"},
		{"go run .   # POST /v1/orders", "go vet ./... #"}, // vet compiles and checks every package without linking nine binaries
	} {
		if !strings.Contains(script, r[0]) {
			t.Fatalf("README.md's example-install block no longer has %q", r[0])
		}
		script = strings.Replace(script, r[0], r[1], 1)
	}
	start := time.Now()
	cmd := exec.Command("bash", "-euc", script)
	cmd.Dir, cmd.Env = t.TempDir(), append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s\n%s", err, script, out)
	}
	t.Logf("copied, tidied and vetted %s in %v", strings.Join(names, ", "), time.Since(start).Round(time.Millisecond))
}

// readmeBlock returns the sh block that follows marker in README.md.
func readmeBlock(t *testing.T, marker string) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), marker)
	if !ok {
		t.Fatalf("README.md has no %s block", marker)
	}
	_, after, _ = strings.Cut(after, "```sh\n")
	script, _, ok := strings.Cut(after, "```")
	if !ok {
		t.Fatalf("README.md's %s block is not closed", marker)
	}
	return script
}
