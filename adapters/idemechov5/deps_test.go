package idemechov5_test

import (
	"testing"

	"github.com/idemkit/idem/core/adaptertest"
)

// The module graph holds Echo v5 and no other framework (Echo v4
// included) and no store driver.
func TestModuleGraph(t *testing.T) {
	adaptertest.CheckModuleGraph(t, "github.com/labstack/echo/v5", []string{"github.com/labstack/echo/v4",
		"github.com/gin-gonic/gin", "github.com/gofiber/fiber", "github.com/valyala/fasthttp", "github.com/redis/go-redis",
		"go.mongodb.org/mongo-driver"}, nil)
}
