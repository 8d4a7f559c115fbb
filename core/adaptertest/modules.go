package adaptertest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// GoCmd runs the go command with args on the module in the current
// directory, resolved on its own (GOWORK=off, read-only go.mod) as a user's
// `go get` would, and returns its output; it fails t when the command fails.
func GoCmd(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// CheckModuleGraph fails t when `go list -m all` of the module in the
// current directory (see GoCmd) lacks the module path want, or lists a
// module whose path starts with one of forbidden and with none of allowed:
// importing one adapter must never pull in another framework or a store
// driver.
func CheckModuleGraph(t *testing.T, want string, forbidden, allowed []string) {
	t.Helper()
	out := GoCmd(t, "list", "-m", "all")
	found := false
	for _, line := range strings.Split(out, "\n") {
		path, _, _ := strings.Cut(line, " ")
		found = found || path == want
		for _, f := range forbidden {
			if strings.HasPrefix(line, f) && !hasAnyPrefix(line, allowed) {
				t.Errorf("go list -m all lists %q", line)
			}
		}
	}
	if !found {
		t.Fatalf("go list -m all lacks %s:\n%s", want, out)
	}
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
