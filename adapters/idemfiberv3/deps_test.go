package idemfiberv3_test

import (
	"testing"

	"github.com/idemkit/idem/core/adaptertest"
)

// The module graph holds Fiber v3 and no other framework (Fiber v2
// included) and no store driver.
func TestModuleGraph(t *testing.T) {
	adaptertest.CheckModuleGraph(t, "github.com/gofiber/fiber/v3", []string{"github.com/gofiber/fiber/v2",
		"github.com/gin-gonic/gin", "github.com/labstack/echo", "github.com/redis/go-redis", "go.mongodb.org/mongo-driver"}, nil)
}
