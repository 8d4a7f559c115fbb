package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The program plays its senders against its receiver and every event is
// processed exactly once, on each store; redeliveries get replays, and the
// forged and the replayed old delivery get 400.
func TestRun(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			o := options{store: store, redisURL: os.Getenv("IDEM_REDIS_URL"), events: 3, copies: 4, processing: 200 * time.Millisecond}
			if store == "redis" {
				if o.redisURL == "" {
					o.redisURL = "redis://127.0.0.1:6379/0"
				}
				b := make([]byte, 6)
				_, _ = rand.Read(b)
				o.redisPrefix = "idem-example-webhooks-test-" + hex.EncodeToString(b) + ":"
				t.Cleanup(func() { deleteKeys(t, o.redisURL, o.redisPrefix) })
			}
			var out bytes.Buffer
			if err := run(context.Background(), o, &out); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			// Which copy processes an event, and whether others arrive while
			// it runs (503) or after (a replay), depends on scheduling; these
			// lines appear in every run.
			for _, want := range []string{
				"6 events, each processed exactly once",
				"200 replayed",
				"cut copy, redelivered  attempt 1:",
				"forged                 attempt 1: 400 webhook-signature-invalid",
				"replayed 10 min later  attempt 1: 400 webhook-timestamp-outside-tolerance",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func deleteKeys(t *testing.T, url, prefix string) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Error(err)
	}
	if len(keys) == 0 {
		t.Errorf("no records under %s: the run did not use Redis", prefix)
		return
	}
	c.Del(ctx, keys...)
}
