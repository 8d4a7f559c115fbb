package docs

// doc: stores/redisstore/README.md
import (
	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/redisstore"
)

// doc end

import (
	"log/slog"
)

func redisstoreSetup() {
	// doc: stores/redisstore/README.md
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close() // yours: the store borrows the client and never closes it

	store := redisstore.New(client, redisstore.WithPrefix("payments:idem:"))
	engine, err := idem.New(store)
	// doc end
	_, _ = engine, err
}

func redisstoreCheck() {
	var store *redisstore.Store
	var logger *slog.Logger
	_ = func() error {
		// doc: stores/redisstore/README.md
		if err := store.Check(ctx, logger); err != nil { // nil logger: slog.Default()
			return err // Redis unreachable
		}
		// doc end
		return nil
	}
	_ = idem.New
}

func redisstoreWithoutBatching() {
	_ = func() error {
		// doc: stores/redisstore/README.md
		client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", PoolSize: 64}) // a connection per concurrent request
		store := redisstore.New(client, redisstore.WithPrefix("payments:idem:"), redisstore.WithoutBatching())
		// doc end
		_ = store
		return nil
	}
}
