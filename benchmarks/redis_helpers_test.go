package benchmarks

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/stores/redisstore"
)

func redisstoreNew(c *redis.Client, prefix string) *redisstore.Store {
	return redisstore.New(c, redisstore.WithPrefix(prefix))
}

// usedMemory returns INFO memory's used_memory in bytes.
func usedMemory(tb testing.TB, c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return n
		}
	}
	tb.Fatal("INFO memory has no used_memory")
	return 0
}
