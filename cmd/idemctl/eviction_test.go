package main

import (
	"bytes"
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestEvictionHint: on a Redis whose maxmemory-policy can evict records
// (allkeys-lru, started here on a free port), a record not found comes
// with that hint; on one with noeviction, it does not.
func TestEvictionHint(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not in PATH: %v", err)
	}
	for policy, want := range map[string]bool{"allkeys-lru": true, "noeviction": false} {
		t.Run(policy, func(t *testing.T) {
			addr := startRedis(t, bin, "--maxmemory", "64mb", "--maxmemory-policy", policy)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var out, errOut bytes.Buffer
			code := run(ctx, []string{"show", "-store", "redis://" + addr + "/0", randomHex(64)}, strings.NewReader(""), &out, &errOut)
			got := strings.Contains(errOut.String(), "has maxmemory-policy "+policy+" (maxmemory 67108864 bytes): it may have evicted the record")
			if code != exitFail || got != want {
				t.Fatalf("show on a Redis with %s = %d, eviction hint %v, want %v; stderr:\n%s", policy, code, got, want, errOut.String())
			}
		})
	}
}

// startRedis starts a private redis-server on a free loopback port with
// no persistence, stopped at the end of the test, and returns its address.
func startRedis(t *testing.T, bin string, args ...string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(20 * time.Second); c.Ping(context.Background()).Err() != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer PING", addr)
		}
	}
	return addr
}
