package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestInstall runs the install line of the README's idemctl-install
// block (and of the package doc) from the repository root, as a user of
// the checkout does, and the installed binary.
func TestInstall(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(readme), "<!-- idemctl-install:")
	block, _, _ = strings.Cut(block, "\n```\n")
	if !strings.Contains(block, "\ngo install ./cmd/idemctl ") {
		t.Fatalf("README.md's idemctl-install block no longer runs go install ./cmd/idemctl from the root:\n%s", block)
	}
	bin := t.TempDir()
	cmd := exec.Command("go", "install", "./cmd/idemctl")
	cmd.Dir = filepath.Join("..", "..")
	// The user's environment: the go.work at the root found as usual.
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOWORK=") }), "GOBIN="+bin, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install ./cmd/idemctl: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(bin, "idemctl")).CombinedOutput()
	if code := exitCode(err); code != exitUsage || !strings.HasPrefix(string(out), "usage: idemctl") {
		t.Fatalf("the installed idemctl without arguments = %d (%v)\n%s\nwant exit %d and the usage", code, err, out, exitUsage)
	}
}

func exitCode(err error) int {
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
