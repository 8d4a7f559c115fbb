package redisstore_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Environment of the integration tests.
//
//	IDEM_REDIS_URL            standalone Redis, default redis://127.0.0.1:6379/0
//	IDEM_REDIS_CLUSTER_ADDRS  comma-separated seed addresses of an existing
//	                          Redis Cluster; unset: the tests start a local
//	                          3-master cluster with redis-server and redis-cli
//	CI=true                   an unreachable server or a missing binary fails
//	                          the tests instead of skipping them
const defaultRedisURL = "redis://127.0.0.1:6379/0"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		stopCluster()
		os.Exit(code)
	}))
}

func inCI() bool { return os.Getenv("CI") == "true" }

// unavailable fails the test under CI=true and skips it otherwise.
func unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if inCI() {
		tb.Fatalf("%s (CI=true: failing instead of skipping)", msg)
	}
	tb.Skipf("%s; skipping (set CI=true to fail instead)", msg)
}

func redisURL() string {
	if u := os.Getenv("IDEM_REDIS_URL"); u != "" {
		return u
	}
	return defaultRedisURL
}

// newClient returns a client to the standalone Redis of IDEM_REDIS_URL,
// closed at the end of the test.
func newClient(tb testing.TB) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(redisURL())
	if err != nil {
		tb.Fatalf("IDEM_REDIS_URL %q: %v", redisURL(), err)
	}
	opt.ContextTimeoutEnabled = true
	c := redis.NewClient(opt)
	tb.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		unavailable(tb, "Redis unreachable at %s (IDEM_REDIS_URL): %v", redisURL(), err)
	}
	return c
}

// newPrefix returns a random key prefix; the keys under it are deleted at
// the end of the test (never FLUSHDB: the server may be shared).
func newPrefix(tb testing.TB, c redis.UniversalClient) string {
	p := "idemtest:" + rand.Text()[:12] + ":"
	tb.Cleanup(func() { deletePrefix(c, p) })
	return p
}

func deletePrefix(c redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Unlink(ctx, iter.Val())
		}
		return iter.Err()
	}
	switch c := c.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachMaster(ctx, del)
	case *redis.Client:
		_ = del(ctx, c)
	}
}

// binary returns the path of a Redis binary (redis-server, redis-cli).
func binary(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		unavailable(tb, "%s not found in PATH: %v", name, err)
	}
	return p
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	port, err := findPort(false)
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// findPort finds a free loopback port; with bus, port+10000 (the Redis
// Cluster bus port) must be free too.
func findPort(bus bool) (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !bus {
			l.Close()
			return port, nil
		}
		if port+10000 < 65536 {
			if l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
				l2.Close()
				l.Close()
				return port, nil
			}
		}
		l.Close()
	}
	return 0, fmt.Errorf("no free port pair found")
}

// redisProc is a private redis-server process started by a test.
type redisProc struct {
	cmd  *exec.Cmd
	addr string
	log  string
}

// startRedis starts redis-server on port with no persistence, data in dir,
// and waits until it answers PING. It dies with the test binary (Pdeathsig).
func startRedis(bin string, port int, dir string, extra ...string) (*redisProc, error) {
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir}, extra...)
	logPath := filepath.Join(dir, "redis-"+strconv.Itoa(port)+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &redisProc{cmd: cmd, addr: "127.0.0.1:" + strconv.Itoa(port), log: logPath}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(p.addr); err == nil {
			return p, nil
		} else if time.Now().After(deadline) {
			p.stop()
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("redis-server on %s not ready: %w\n%s", p.addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the process to exit.
func (p *redisProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// startRedisT starts a private redis-server for the test, stopped at its end.
func startRedisT(tb testing.TB, port int, extra ...string) *redisProc {
	tb.Helper()
	bin := binary(tb, "redis-server")
	p, err := startRedis(bin, port, tb.TempDir(), extra...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.stop)
	return p
}

// ping sends a raw PING, without a client library.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// The local cluster is shared by every cluster test of the run and stopped
// by TestMain.
var cluster struct {
	once  sync.Once
	addrs []string
	err   error
	procs []*redisProc
	dir   string
}

func stopCluster() {
	for _, p := range cluster.procs {
		p.stop()
	}
	if cluster.dir != "" {
		_ = os.RemoveAll(cluster.dir)
	}
}

// clusterAddrs returns the seed addresses of IDEM_REDIS_CLUSTER_ADDRS, or
// of a local 3-master cluster started on first use.
func clusterAddrs(tb testing.TB) []string {
	tb.Helper()
	if env := os.Getenv("IDEM_REDIS_CLUSTER_ADDRS"); env != "" {
		return strings.Split(env, ",")
	}
	server, cli := binary(tb, "redis-server"), binary(tb, "redis-cli")
	cluster.once.Do(func() {
		cluster.err = startCluster(server, cli)
	})
	if cluster.err != nil {
		unavailable(tb, "local Redis Cluster: %v", cluster.err)
	}
	return cluster.addrs
}

func startCluster(server, cli string) error {
	dir, err := os.MkdirTemp("", "idem-redis-cluster-")
	if err != nil {
		return err
	}
	cluster.dir = dir
	cluster.addrs, cluster.procs, err = createCluster(server, cli, dir)
	return err
}

// createCluster starts three redis-server nodes with data under dir, joins
// them into a 3-master cluster without replicas and waits until every node
// reports cluster_state:ok. The processes are returned even on error, for
// the caller to stop.
func createCluster(server, cli, dir string) ([]string, []*redisProc, error) {
	var addrs []string
	var procs []*redisProc
	for i := range 3 {
		port, err := findPort(true)
		if err != nil {
			return nil, procs, err
		}
		nodeDir := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(nodeDir, 0o755); err != nil {
			return nil, procs, err
		}
		p, err := startRedis(server, port, nodeDir, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(nodeDir, "nodes-"+strconv.Itoa(port)+".conf"))
		if err != nil {
			return nil, procs, err
		}
		procs = append(procs, p)
		addrs = append(addrs, p.addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		return nil, procs, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if ctx.Err() != nil {
				c.Close()
				return nil, procs, fmt.Errorf("cluster node %s not ok: %w %q", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return addrs, procs, nil
}

// newClusterClient returns a Cluster client, closed at the end of the test.
func newClusterClient(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	addrs := clusterAddrs(tb)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		unavailable(tb, "Redis Cluster at %v unreachable: %v", addrs, err)
	}
	return c
}
