package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestDemoOutput runs the demo itself against Redis, for one framework: it
// prints its result table and nothing else (the services' panic stack traces
// stay in their log file), and every key it writes is under its own
// -redis-prefix, and it deletes them when it is done.
func TestDemoOutput(t *testing.T) {
	client := redisClient(t)
	prefix := "idem-demo-test:" + rand.Text()[:12] + ":"
	t.Cleanup(func() { deleteKeys(client, prefix) })
	bin := filepath.Join(t.TempDir(), "demo")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-framework", "nethttp", "-store", "redis", "-redis-url", redisURL(),
		"-redis-prefix", prefix, "-charge-latency", "100ms")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("demo wrote to stderr:\n%s", stderr.String())
	}
	lines := strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n")
	want := []string{"nethttp, redis store, provider latency 100ms", "scenario"}
	for _, s := range scenarios {
		want = append(want, s.name)
	}
	want = append(want, "idem decisions on /metrics: acquired ", "", "removed the demo's ", "OK: one charge per logical payment")
	if len(lines) != len(want) {
		t.Fatalf("demo printed %d lines, want %d (title, header, %d rows, decisions, blank, keys removed, verdict):\n%s", len(lines), len(want), len(scenarios), stdout.String())
	}
	if l := lines[len(lines)-2]; strings.HasPrefix(l, "removed the demo's 0 ") {
		t.Errorf("%q: the demo wrote no Redis key under its prefix", l)
	}
	if l := lines[len(lines)-4]; !strings.Contains(l, "replayed ") || !strings.Contains(l, "conflict ") || !strings.Contains(l, "completed ") {
		t.Errorf("decisions line %q: want replays, conflicts and completions counted", l)
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, want[i]) || want[i] == "" && l != "" {
			t.Errorf("line %d = %q, want it to start with %q", i+1, l, want[i])
		}
	}
	// Every kind of operation, each row's answers and verdict: the retried
	// order, stock decrement, email and sign-up are replayed, and the
	// sign-up without idem gets the unique constraint's 409.
	for name, answers := range map[string]string{
		"order: answer lost, retried twice":            "201 ×1, 201 replay ×2",
		"stock: decrement by 1, retried twice":         "200 ×1, 200 replay ×2",
		"email: answer lost, retried":                  "202 ×1, 202 replay ×1",
		"sign-up, unique email: retried, with idem":    "201 ×1, 201 replay ×1",
		"sign-up, unique email: retried, without idem": "201 ×1, 409 ×1",
	} {
		i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, name) })
		if i < 0 {
			t.Errorf("no row %q", name)
			continue
		}
		if l := lines[i]; !strings.Contains(l, " "+answers+" ") || !strings.Contains(l, " ok") {
			t.Errorf("row %q, want answers %q and ok", l, answers)
		}
	}
	if i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "stock:") }); i >= 0 && !strings.Contains(lines[i], "stock 100 → 99") {
		t.Errorf("stock row %q: want the stock to go from 100 to 99 once", lines[i])
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// One SCAN call covers only part of a large keyspace (the shared Redis
	// may hold other tests' and benchmarks' records): iterate to the end.
	it := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	found := it.Next(ctx)
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if found {
		t.Errorf("the demo left Redis key %q behind", it.Val())
	}
}

func redisURL() string {
	if u := os.Getenv("IDEM_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// redisClient returns a client to the Redis of IDEM_REDIS_URL; the test fails
// without one under CI=true, else skips.
func redisClient(t *testing.T) *redis.Client {
	opt, err := redis.ParseURL(redisURL())
	if err != nil {
		t.Fatalf("IDEM_REDIS_URL %q: %v", redisURL(), err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		msg := fmt.Sprintf("Redis unreachable at %s (IDEM_REDIS_URL): %v", redisURL(), err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg + "; skipping (set CI=true to fail instead)")
	}
	return c
}

// deleteKeys deletes the Redis keys under prefix.
func deleteKeys(c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Unlink(ctx, iter.Val())
	}
}

// mongoReachable reports whether a MongoDB server answers a ping at uri.
func mongoReachable(uri string) bool {
	c, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(2 * time.Second))
	if err != nil {
		return false
	}
	defer func() { _ = c.Disconnect(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return c.Ping(ctx, nil) == nil
}
