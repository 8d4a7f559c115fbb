package model_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/mongostore"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// The journal model's sequences per store in make test; -rapid.checks
// (make robustness: ROBUST_CHECKS) runs more.
const (
	journalChecksMem  = 300
	journalChecksReal = 15
)

func TestJournalMemstore(t *testing.T) {
	clk := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	var s *memstore.Store
	tg := &jtarget{
		lapse: func(ctx context.Context, key, token string) error {
			if err := s.Extend(ctx, key, token, time.Millisecond); err != nil {
				return err
			}
			clk.Advance(time.Second)
			return nil
		},
	}
	tg.reset = func() {
		if s != nil {
			_ = s.Close()
		}
		s = memstore.New(memstore.WithClock(clk.Now), memstore.WithCleanupInterval(0))
		tg.store = s
	}
	t.Cleanup(func() {
		if s != nil {
			_ = s.Close()
		}
	})
	runJournal(t, journalChecksMem, tg)
}

// redisJournalTarget: each sequence under its own prefix, so that Lapsed
// (the prefix's recovery index) sees its records only.
func redisJournalTarget(c redis.UniversalClient, prefix string) *jtarget {
	tg := &jtarget{indexedLapse: true, reacquire: reacquireSame}
	seq := 0
	tg.reset = func() {
		seq++
		s := redisstore.New(c, redisstore.WithPrefix(fmt.Sprintf("%s%d:", prefix, seq)))
		tg.store, tg.lapse = s, extendLapse(s)
	}
	return tg
}

func TestJournalRedis(t *testing.T) {
	c := redisClient(t)
	prefix := "idemjmodel:" + rand.Text()[:12] + ":"
	t.Cleanup(func() { unlinkPrefix(c, prefix) })
	runJournal(t, journalChecksReal, redisJournalTarget(c, prefix))
}

func unlinkPrefix(c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Unlink(ctx, iter.Val())
	}
}

// TestJournalRedisCluster runs the journal model on a 3-master Redis
// Cluster the test starts (redis-server and redis-cli from PATH), or on
// IDEM_REDIS_CLUSTER_ADDRS.
func TestJournalRedisCluster(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	prefix := "idemjmodel:" + rand.Text()[:12] + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { unlinkPrefix(n, prefix); return nil })
	})
	runJournal(t, journalChecksReal, redisJournalTarget(c, prefix))
}

// clusterAddrs returns IDEM_REDIS_CLUSTER_ADDRS, or starts three
// cluster-enabled redis-server processes (stopped at the end of the test)
// and joins them into a cluster of three masters.
func clusterAddrs(t *testing.T) []string {
	if env := os.Getenv("IDEM_REDIS_CLUSTER_ADDRS"); env != "" {
		return strings.Split(env, ",")
	}
	server, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "no redis-server on PATH for a Redis Cluster")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		unavailable(t, "no redis-cli on PATH for a Redis Cluster")
	}
	var addrs []string
	for i := range 3 {
		port := clusterPort(t)
		dir := filepath.Join(t.TempDir(), strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(server, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		addr := "127.0.0.1:" + strconv.Itoa(port)
		waitRedis(t, addr)
		addrs = append(addrs, addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	if out, err := exec.Command(cli, append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		deadline := time.Now().Add(2 * time.Minute)
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s not ok: %v %q", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	return addrs
}

// clusterPort is a free loopback port whose cluster bus port (+10000) is
// free too.
func clusterPort(t *testing.T) int {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if port+10000 < 65536 {
			if l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
				_ = l2.Close()
				_ = l.Close()
				return port
			}
		}
		_ = l.Close()
	}
	t.Fatal("no free port pair for a Redis Cluster node")
	return 0
}

func waitRedis(t *testing.T, addr string) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestJournalMongo: the store's clock offset measured once (an hour's
// refresh), so that its clock is the local one shifted by a constant and
// a lapse waited for locally holds (see Lapses).
func TestJournalMongo(t *testing.T) {
	u := os.Getenv("IDEM_MONGO_URI")
	if u == "" {
		unavailable(t, "IDEM_MONGO_URI is not set (run `make test`, which starts tools/ferretdb)")
	}
	c, err := mongo.Connect(options.Client().ApplyURI(u))
	if err != nil {
		t.Fatalf("connect %s: %v", u, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Disconnect(ctx)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Ping(ctx, readpref.Primary()); err != nil {
		unavailable(t, "MongoDB-wire server unreachable at %s (IDEM_MONGO_URI): %v", u, err)
	}
	coll := c.Database("idem_model_test").Collection("j_"+rand.Text()[:12],
		options.Collection().SetWriteConcern(writeconcern.Majority()).SetReadPreference(readpref.Primary()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = coll.Drop(ctx)
	})
	s := mongostore.New(coll, mongostore.WithClockRefresh(time.Hour))
	t.Cleanup(func() { _ = s.Close() })
	runJournal(t, journalChecksReal, &jtarget{store: s, lapse: extendLapse(s), indexedLapse: true, reacquire: reacquireNone, reset: func() {
		if _, err := coll.DeleteMany(context.Background(), bson.D{}); err != nil {
			t.Fatal(err)
		}
	}})
}

func TestJournalPostgres(t *testing.T) {
	u := os.Getenv("IDEM_POSTGRES_URL")
	if u == "" {
		u = "postgres://postgres@127.0.0.1:5432/test"
	}
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatalf("IDEM_POSTGRES_URL %q: %v", u, err)
	}
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		unavailable(t, "PostgreSQL unreachable at %s (IDEM_POSTGRES_URL): %v", u, err)
	}
	table := "idem_jmodel_" + strings.ToLower(rand.Text()[:12])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
	})
	s := pgstore.New(pool, pgstore.WithTable(table))
	if err := s.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	runJournal(t, journalChecksReal, &jtarget{store: s, lapse: extendLapse(s), reacquire: reacquireReplace, reset: func() {
		if _, err := pool.Exec(context.Background(), "DELETE FROM "+table); err != nil {
			t.Fatal(err)
		}
	}})
}

func TestJournalMySQL(t *testing.T) {
	dsn := os.Getenv("IDEM_MYSQL_DSN")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("IDEM_MYSQL_DSN %q: %v", dsn, err)
	}
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		unavailable(t, "MySQL unreachable (IDEM_MYSQL_DSN): %v", err)
	}
	table := "idem_jmodel_" + strings.ToLower(rand.Text()[:12])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, q := range []string{"DROP TABLE IF EXISTS `" + table + "`", "DROP PROCEDURE IF EXISTS `" + table + mysqlstore.ProcSuffix + "`"} {
			_, _ = db.ExecContext(ctx, q)
		}
	})
	s := mysqlstore.New(db, mysqlstore.WithTable(table))
	if err := s.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	runJournal(t, journalChecksReal, &jtarget{store: s, lapse: extendLapse(s), reacquire: reacquireReplace, reset: func() {
		if _, err := db.ExecContext(context.Background(), "DELETE FROM `"+table+"`"); err != nil {
			t.Fatal(err)
		}
	}})
}
