package idemgin_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The module graph holds no other framework and no store driver. Gin v1.12
// itself requires go.mongodb.org/mongo-driver/v2 (for its BSON binding and
// renderer), so that one is allowed only as a requirement of gin.
func TestModuleGraph(t *testing.T) {
	run := func(args ...string) string {
		cmd := exec.Command("go", args...)
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	forbidden := []string{"github.com/labstack/echo", "github.com/gofiber/fiber", "github.com/valyala/fasthttp",
		"github.com/redis/go-redis", "go.mongodb.org/mongo-driver"}
	for _, line := range strings.Split(run("list", "-m", "all"), "\n") {
		for _, f := range forbidden {
			if strings.HasPrefix(line, f) && !strings.HasPrefix(line, "go.mongodb.org/mongo-driver/v2 ") {
				t.Errorf("go list -m all lists %q", line)
			}
		}
	}
	byGin := false
	for _, edge := range strings.Split(run("mod", "graph"), "\n") {
		from, to, ok := strings.Cut(edge, " ")
		if !ok || !strings.HasPrefix(to, "go.mongodb.org/mongo-driver") {
			continue
		}
		switch {
		case strings.HasPrefix(from, "github.com/gin-gonic/gin@"):
			byGin = true
		case from != "github.com/idemkit/idem/adapters/idemgin": // the main module lists it as // indirect
			t.Errorf("mongo driver required by %s, not by gin", from)
		}
	}
	if !byGin {
		t.Log("gin no longer requires the mongo driver: drop the exception")
	}
}
