package idemgin_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idem/core/adaptertest"
)

// The module graph holds no other framework and no store driver. Gin v1.12
// itself requires go.mongodb.org/mongo-driver/v2 (for its BSON binding and
// renderer), so that one is allowed only as a requirement of gin.
func TestModuleGraph(t *testing.T) {
	adaptertest.CheckModuleGraph(t, "github.com/gin-gonic/gin", []string{"github.com/labstack/echo",
		"github.com/gofiber/fiber", "github.com/valyala/fasthttp", "github.com/redis/go-redis", "go.mongodb.org/mongo-driver"},
		[]string{"go.mongodb.org/mongo-driver/v2 "})
	byGin := false
	for _, edge := range strings.Split(adaptertest.GoCmd(t, "mod", "graph"), "\n") {
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
