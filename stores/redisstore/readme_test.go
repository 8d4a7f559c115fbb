package redisstore_test

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/redisstore"
)

// TestReadmeKeyLayout: every Redis key layout the README shows
// (`<prefix>…` spans) is one the store writes, and every key the store
// writes has its layout in the README. A record is taken under a keep
// (its response then lives in the response key), journals a step, keeps
// a recovery payload and completes, under a plain prefix and under one
// holding a Cluster hash tag; the keys under each prefix are read back
// with SCAN and named by their layout.
func TestReadmeKeyLayout(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var doc []string
	for _, m := range regexp.MustCompile("`(<prefix>[^`]*)`").FindAllStringSubmatch(string(b), -1) {
		if !slices.Contains(doc, m[1]) {
			doc = append(doc, m[1])
		}
	}
	slices.Sort(doc)
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var written []string
	for _, tagged := range []bool{false, true} {
		prefix := newPrefix(t, c)
		if tagged {
			prefix = "{" + strings.TrimSuffix(prefix, ":") + "}:"
			t.Cleanup(func() { deletePrefix(c, prefix) })
		}
		s := redisstore.New(c, redisstore.WithPrefix(prefix))
		key := idem.ScopedKey("acct_1", "POST", "/v1/payments", "layout-"+time.Now().Format("150405.000000"))
		if _, ok, err := s.AcquireKeep(ctx, key, "tok", "fp", time.Minute, idem.Keep{Tombstone: time.Hour}); err != nil || !ok {
			t.Fatalf("AcquireKeep = %v, %v", ok, err)
		}
		if _, err := s.StartStep(ctx, key, "tok", "charge", time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := s.SetRecovery(ctx, key, "tok", []byte("payload"), time.Hour, time.Minute); err != nil {
			t.Fatal(err)
		}
		// the journal before completion drops it: the keys now
		keys := scanPrefix(ctx, t, c, prefix)
		if err := s.Complete(ctx, key, "tok", idem.EncodeResponse(&idem.Response{Status: 201}), time.Hour); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, scanPrefix(ctx, t, c, prefix)...)
		for _, k := range keys {
			layout := strings.ReplaceAll(strings.ReplaceAll(k, prefix+key, "<prefix><key>"), prefix, "<prefix>")
			if !slices.Contains(written, layout) {
				written = append(written, layout)
			}
		}
	}
	slices.Sort(written)
	if !slices.Equal(doc, written) {
		t.Errorf("README.md shows the key layouts\n%s\nthe store writes\n%s\nmake the README say what the store writes", strings.Join(doc, "\n"), strings.Join(written, "\n"))
	}
}

// scanPrefix returns the keys under prefix.
func scanPrefix(ctx context.Context, t *testing.T, c *redis.Client, prefix string) []string {
	t.Helper()
	var keys []string
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}
