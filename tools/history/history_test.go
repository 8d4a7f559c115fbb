package history_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/mongostore"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
	"github.com/idemkit/idem/tools/history"
)

// seeded is how many records each test seeds: more than one SQL batch
// would be slow in make test; enough that a Lapsed reading completed
// records would meet them (64 per call).
const seeded = 3000

// env returns the variable, skipping the test without it (failing under
// CI=true).
func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set (CI=true)", name)
		}
		t.Skipf("%s is not set (scripts/services.sh exports it)", name)
	}
	return v
}

func suffix() string { return strings.ToLower(rand.Text()[:10]) }

// check seeds s through clone, reads a sample of the copies back through
// the Store API (completed, the template's fingerprint and response), and
// leaves a crashed record that the first Lapsed returns, alone.
func check(t *testing.T, s idem.Store, clone history.Cloner) {
	ctx := context.Background()
	template, err := history.Seed(ctx, s, clone, seeded)
	if err != nil {
		t.Fatal(err)
	}
	want, ok, err := s.Get(ctx, template)
	if err != nil || !ok || want.State != idem.StateCompleted {
		t.Fatalf("Get(template) = %+v, %v, %v; want completed", want, ok, err)
	}
	for _, i := range []int{1, 2, seeded / 2, seeded - 1} {
		rec, ok, err := s.Get(ctx, history.CloneKey(template, i))
		if err != nil || !ok || rec.State != idem.StateCompleted || rec.Fingerprint != want.Fingerprint || !bytes.Equal(rec.Response, want.Response) {
			t.Fatalf("Get(copy %d) = %+v, %v, %v; want completed as the template", i, rec, ok, err)
		}
	}
	if rec, ok, err := s.Get(ctx, history.CloneKey(template, seeded)); err != nil || ok {
		t.Fatalf("Get(copy %d) = %+v, %v, %v; want absent (n-1 copies)", seeded, rec, ok, err)
	}
	first, passes, _, err := storetest.PassesUntilLapsed(ctx, s, 64, 1, 300*time.Millisecond)
	if err != nil || first != 1 || passes != 1 {
		t.Fatalf("PassesUntilLapsed = first %d, passes %d, %v; want the crashed record alone, by the first Lapsed", first, passes, err)
	}
}

func TestMemory(t *testing.T) {
	s := memstore.New(memstore.WithCleanupInterval(0))
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	if _, err := history.Seed(ctx, s, nil, seeded); err != nil {
		t.Fatal(err)
	}
	first, passes, _, err := storetest.PassesUntilLapsed(ctx, s, 64, 1, 300*time.Millisecond)
	if err != nil || first != 1 || passes != 1 {
		t.Fatalf("PassesUntilLapsed = first %d, passes %d, %v; want the crashed record alone", first, passes, err)
	}
}

func TestPostgres(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, env(t, "IDEM_POSTGRES_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table := "idem_history_" + suffix()
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+table) })
	s := pgstore.New(pool, pgstore.WithTable(table))
	t.Cleanup(func() { _ = s.Close() })
	if err := s.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	check(t, s, history.Postgres(pool, table))
}

func TestMySQL(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("mysql", env(t, "IDEM_MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	table := "idem_history_" + suffix()
	s := mysqlstore.New(db, mysqlstore.WithTable(table))
	t.Cleanup(func() {
		_ = s.Close()
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+table+"`")
		_, _ = db.ExecContext(ctx, "DROP PROCEDURE IF EXISTS `"+table+mysqlstore.ProcSuffix+"`")
	})
	if err := s.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	check(t, s, history.MySQL(db, table))
}

func TestMongo(t *testing.T) {
	ctx := context.Background()
	client, err := mongo.Connect(options.Client().ApplyURI(env(t, "IDEM_MONGO_URI")).SetServerSelectionTimeout(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	coll := client.Database("idemtest").Collection("history_" + suffix())
	t.Cleanup(func() {
		_ = coll.Drop(ctx)
		_ = client.Disconnect(ctx)
	})
	s := mongostore.New(coll)
	t.Cleanup(func() { s.Close() })
	if err := s.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	check(t, s, history.Mongo(coll))
}

func TestRedis(t *testing.T) {
	ctx := context.Background()
	opts, err := redis.ParseURL(env(t, "IDEM_REDIS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	prefix := fmt.Sprintf("idemhistory:%s:", suffix())
	t.Cleanup(func() {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Unlink(ctx, iter.Val())
		}
		_ = c.Close()
	})
	check(t, redisstore.New(c, redisstore.WithPrefix(prefix)), history.Redis(c, prefix))
}
