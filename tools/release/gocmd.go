package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// goEnv is the environment of every go command run here: the module on its
// own, as a user's build sees it (GOWORK=off), with go.mod and go.sum
// updates allowed (GOFLAGS=-mod=mod) for the consumer modules written here.
func goEnv() []string {
	return append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
}

// run runs name with args in dir and returns its standard output; the
// error carries the command line and its combined output.
func run(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = env
	var stdout, stderr strings.Builder
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s (in %s): %w\n%s%s", name, strings.Join(args, " "), dir, err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// goRun runs the go command in dir with goEnv.
func goRun(dir string, args ...string) (string, error) { return run(dir, goEnv(), "go", args...) }

// lines splits command output into its non-empty lines.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}
