package idemfiber_test

import (
	"testing"

	"github.com/idemkit/idem/core/adaptertest"
)

// The module graph holds no other framework and no store driver.
func TestModuleGraph(t *testing.T) {
	adaptertest.CheckModuleGraph(t, "github.com/gofiber/fiber/v2", []string{"github.com/gin-gonic/gin",
		"github.com/labstack/echo", "github.com/redis/go-redis", "go.mongodb.org/mongo-driver"}, nil)
}
