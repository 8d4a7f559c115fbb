package main

import (
	"os"
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
