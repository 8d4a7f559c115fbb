package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The README's quick start is this program, verbatim from its package
// clause on.
func TestREADMEQuickStart(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	program := string(src[strings.Index(string(src), "package main"):])
	if !strings.Contains(string(readme), "```go\n"+program+"```\n") {
		t.Fatal("README.md's quick start differs from examples/quickstart/main.go: copy the program (from `package main`) into the README's first go block")
	}
}

// TestREADMECheckoutInstall follows the README's "Before the modules are
// published" recipe in a fresh module of a user's, with the quick start as
// its main.go, against this checkout, and builds it: the install path the
// README gives works as written.
func TestREADMECheckoutInstall(t *testing.T) {
	script := readmeBlock(t, "<!-- checkout-install:")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// The first line sets IDEM to the reader's checkout: this one instead.
	script = strings.Replace(script, "IDEM=$HOME/src/idem", "IDEM="+root, 1)
	if !strings.Contains(script, "IDEM="+root) {
		t.Fatal("the recipe's first line no longer sets IDEM=$HOME/src/idem")
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), src, 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	for _, step := range []string{"go mod init example.com/payments", script, "go build -o /dev/null ."} {
		cmd := exec.Command("bash", "-euc", step)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", step, err, out)
		}
	}
}
