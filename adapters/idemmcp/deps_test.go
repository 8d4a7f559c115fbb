package idemmcp_test

import (
	"testing"

	"github.com/idemkit/idem/core/adaptertest"
)

// The module graph holds the MCP go-sdk and no HTTP framework, RPC
// framework or store driver.
func TestModuleGraph(t *testing.T) {
	adaptertest.CheckModuleGraph(t, "github.com/modelcontextprotocol/go-sdk", []string{"github.com/gin-gonic/gin",
		"github.com/labstack/echo", "github.com/gofiber/fiber", "google.golang.org/grpc", "connectrpc.com/connect",
		"github.com/redis/go-redis", "go.mongodb.org/mongo-driver", "github.com/jackc/pgx"}, nil)
}
