package model_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/idemkit/idem/stores/mongostore"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// Servers, as `make test` exports them (scripts/services.sh):
//
//	IDEM_REDIS_URL     Redis, default redis://127.0.0.1:6379/0
//	IDEM_MONGO_URI     a MongoDB-wire server (tools/ferretdb or MongoDB)
//	IDEM_POSTGRES_URL  PostgreSQL, default postgres://postgres@127.0.0.1:5432/test
//	IDEM_MYSQL_DSN     MySQL or MariaDB, default root@tcp(127.0.0.1:3306)/test
//	CI=true            an unreachable or unset server fails the test instead of skipping it
func TestMain(m *testing.M) {
	flag.Parse()
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "rapid.checks" {
			checksSet = true
		}
	})
	if os.Getenv("RAPID_CHECKS") != "" {
		checksSet = true
	}
	goleak.VerifyTestMain(m,
		// the MongoDB driver's connection pool and monitors outlive a test
		// until Disconnect, which each test does in Cleanup; these are the
		// HTTP server goroutines net/http keeps for idle keep-alive conns.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

var checksSet bool

// setChecks sets rapid's number of checks unless the command line or
// RAPID_CHECKS did.
func setChecks(n int) {
	if !checksSet {
		_ = flag.Set("rapid.checks", strconv.Itoa(n))
	}
}

// unavailable fails the test under CI=true and skips it otherwise.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true: failing instead of skipping)", msg)
	}
	t.Skipf("%s; skipping (set CI=true to fail instead)", msg)
}

func redisClient(t *testing.T) *redis.Client {
	u := os.Getenv("IDEM_REDIS_URL")
	if u == "" {
		u = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatalf("IDEM_REDIS_URL %q: %v", u, err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		unavailable(t, "Redis unreachable at %s (IDEM_REDIS_URL): %v", u, err)
	}
	return c
}

func TestModelRedis(t *testing.T) {
	c := redisClient(t)
	prefix := "idemmodel:" + rand.Text()[:12] + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Unlink(ctx, iter.Val())
		}
	})
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	run(t, 40, func(*rapid.T) *target {
		return &target{
			store: s, clk: realClock{}, margin: realMargin, reacquire: reacquireSame,
			leases: realLeases, retentions: realRetentions, advances: realAdvances, keeps: realKeeps,
		}
	})
}

func TestModelMongo(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx, readpref.Primary()); err != nil {
		unavailable(t, "MongoDB-wire server unreachable at %s (IDEM_MONGO_URI): %v", u, err)
	}
	coll := c.Database("idem_model_test").Collection("m_"+rand.Text()[:12],
		options.Collection().SetWriteConcern(writeconcern.Majority()).SetReadPreference(readpref.Primary()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = coll.Drop(ctx)
	})
	// The store's clock offset measured once (an hour's refresh): its
	// clock is then the local one shifted by a constant, which the model's
	// windows measure exactly; a refresh within a run could move it by up
	// to half a hello's round trip, past the margin on a loaded machine.
	s := mongostore.New(coll, mongostore.WithClockRefresh(time.Hour))
	t.Cleanup(func() { _ = s.Close() })
	run(t, 35, func(*rapid.T) *target {
		return &target{
			store: s, clk: realClock{}, margin: realMargin, purge: s, lapsedListed: true, reacquire: reacquireNone,
			leases: realLeases, retentions: realRetentions, advances: realAdvances, keeps: realKeeps,
		}
	})
}

// TestModelPostgres runs the model on pgstore at READ COMMITTED (the
// server's default) and REPEATABLE READ (default_transaction_isolation
// of every connection of the pool).
func TestModelPostgres(t *testing.T) {
	u := os.Getenv("IDEM_POSTGRES_URL")
	if u == "" {
		u = "postgres://postgres@127.0.0.1:5432/test"
	}
	for _, level := range []string{"read committed", "repeatable read"} {
		t.Run(strings.ReplaceAll(level, " ", "-"), func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(u)
			if err != nil {
				t.Fatalf("IDEM_POSTGRES_URL %q: %v", u, err)
			}
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var got string
			if err := pool.QueryRow(ctx, "SHOW transaction_isolation").Scan(&got); err != nil {
				unavailable(t, "PostgreSQL unreachable at %s (IDEM_POSTGRES_URL): %v", u, err)
			}
			if got != level {
				t.Fatalf("transaction_isolation = %q, want %q", got, level)
			}
			table := "idem_model_" + strings.ToLower(rand.Text()[:12])
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
			run(t, 30, func(*rapid.T) *target {
				return &target{
					store: s, clk: realClock{}, margin: realMargin, purge: s, purgeCounted: true, reacquire: reacquireReplace, lapsedListed: true,
					leases: realLeases, retentions: realRetentions, advances: realAdvances, keeps: realKeeps,
					reset: func() {
						if _, err := pool.Exec(context.Background(), "DELETE FROM "+table); err != nil {
							t.Fatal(err)
						}
					},
				}
			})
		})
	}
}

// TestModelMySQL runs the model on mysqlstore (MariaDB in `make test`)
// at the server's default isolation (REPEATABLE READ).
func TestModelMySQL(t *testing.T) {
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
	table := "idem_model_" + strings.ToLower(rand.Text()[:12])
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
	run(t, 25, func(*rapid.T) *target {
		return &target{
			store: s, clk: realClock{}, margin: realMargin, purge: s, purgeCounted: true, reacquire: reacquireReplace, lapsedListed: true,
			leases: realLeases, retentions: realRetentions, advances: realAdvances, keeps: realKeeps,
			reset: func() {
				if _, err := db.ExecContext(context.Background(), "DELETE FROM `"+table+"`"); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}
