package idemwebhook_test

import (
	"testing"

	"github.com/idemkit/idem/core/adaptertest"
)

// The module graph holds the Standard Webhooks library and no framework,
// store driver or stripe-go.
func TestModuleGraph(t *testing.T) {
	adaptertest.CheckModuleGraph(t, "github.com/standard-webhooks/standard-webhooks/libraries", []string{"github.com/gin-gonic/gin",
		"github.com/labstack/echo", "github.com/gofiber/fiber", "github.com/valyala/fasthttp", "github.com/redis/go-redis",
		"go.mongodb.org/mongo-driver", "github.com/stripe/stripe-go"}, nil)
}
