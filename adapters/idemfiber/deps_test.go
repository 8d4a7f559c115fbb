package idemfiber_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The module graph holds no other framework and no store driver.
func TestModuleGraph(t *testing.T) {
	cmd := exec.Command("go", "list", "-m", "all")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	forbidden := []string{"github.com/gin-gonic/gin", "github.com/labstack/echo",
		"github.com/redis/go-redis", "go.mongodb.org/mongo-driver"}
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range forbidden {
			if strings.HasPrefix(line, f) {
				t.Errorf("go list -m all lists %q", line)
			}
		}
	}
	if !strings.Contains(string(out), "github.com/gofiber/fiber/v2 ") {
		t.Fatalf("go list -m all lacks fiber:\n%s", out)
	}
}
