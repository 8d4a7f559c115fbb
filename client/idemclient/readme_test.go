package idemclient_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestREADMEClientInstall follows the README's client-only recipe (the
// client-install block) in a fresh module of a user's that imports only
// idemclient, against this checkout, and builds it.
func TestREADMEClientInstall(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, found := strings.Cut(string(readme), "<!-- client-install:")
	if !found {
		t.Fatal("README.md has no client-install block")
	}
	_, script, _ := strings.Cut(block, "```sh\n")
	script, _, _ = strings.Cut(script, "```")
	// The first line sets IDEM to the reader's checkout: this one instead.
	if !strings.Contains(script, "IDEM=$HOME/src/idem") {
		t.Fatal("the recipe's first line no longer sets IDEM=$HOME/src/idem")
	}
	script = strings.Replace(script, "IDEM=$HOME/src/idem", "IDEM="+root, 1)
	dir := t.TempDir()
	main := `package main

import (
	"net/http"

	"github.com/idemkit/idem/client/idemclient"
)

func main() { _ = &http.Client{Transport: idemclient.New()} }
`
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	for _, step := range []string{"go mod init example.com/payclient", script, "go build -o /dev/null ."} {
		cmd := exec.Command("bash", "-euc", step)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", step, err, out)
		}
	}
}
