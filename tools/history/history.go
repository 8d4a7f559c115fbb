// Package history seeds a store with a history of completed recoverable
// records, fast enough for a million on every shared store: what the
// recovery benchmark (benchmarks: BenchmarkLapsedBehindHistory) and the
// payments soak (examples/payments) measure recovery behind.
//
// [Seed] writes one record through the Store API as the template
// (core/storetest.WriteHistoryRecord: acquired, given a recovery payload,
// completed, exactly as core/storetest.WriteHistory writes each), then has
// the store's own server copy it n-1 times under fresh keys ([CloneKey]):
// each copy is the row, document or value the store's Complete left for
// the template (every column and field copied, only the key, and where the
// record keeps one the token, replaced), so the copies are completed
// records as the store writes them and carry no recovery index entry, as
// Complete leaves none. The copying is the store's server's own bulk path:
// PostgreSQL and MySQL one INSERT … SELECT per batch of generated keys
// ([Postgres], [MySQL]), MongoDB insertMany of copies of the template
// document ([Mongo]), Redis pipelined SETs of the template's value with
// its remaining time to live ([Redis]; Redis Cluster too). A store without
// a [Cloner] (memstore) is written through the Store API
// (core/storetest.WriteHistory), which is fast in memory.
//
// A Cloner knows the store's layout (table columns, document fields, key
// names, see each store's doc); the package's tests check that copies read
// back as completed records through the Store API and that Lapsed still
// finds only a due record behind them.
package history

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
)

// Cloner copies the completed record under key template n times (n >= 0)
// in its store's server, copy i (1 to n) under [CloneKey](template, i).
// It returns the first error; copies made before it stay.
type Cloner func(ctx context.Context, template string, n int) error

// Seed writes n completed recoverable records to s (an [idem.Recoverable]):
// one through the Store API (core/storetest.WriteHistoryRecord), whose key
// it returns, and n-1 copies of it made by clone; with clone nil, all n
// through the Store API (core/storetest.WriteHistory; template is then
// ""). n = 0 writes nothing.
func Seed(ctx context.Context, s idem.Store, clone Cloner, n int) (template string, err error) {
	switch {
	case n <= 0:
		return "", nil
	case clone == nil:
		return "", storetest.WriteHistory(ctx, s, n)
	}
	template, err = storetest.WriteHistoryRecord(ctx, s)
	if err != nil {
		return "", err
	}
	return template, clone(ctx, template, n-1)
}

// CloneKey returns the key of copy i of the record under template: the
// SHA-256 of template, ":" and i in decimal, in lowercase hex (64
// characters, a scoped key's shape).
func CloneKey(template string, i int) string {
	sum := sha256.Sum256([]byte(template + ":" + strconv.Itoa(i)))
	return hex.EncodeToString(sum[:])
}

// cloneToken returns a fresh token for copy i: 32 hex characters.
func cloneToken(template string, i int) string {
	sum := sha256.Sum256([]byte(template + ":t:" + strconv.Itoa(i)))
	return hex.EncodeToString(sum[:16])
}

// sqlBatch is how many rows one INSERT … SELECT of [Postgres] and [MySQL]
// copies: one statement (and transaction) each.
const sqlBatch = 100_000

// Postgres returns the [Cloner] of a pgstore.Store on pool and table (as
// given to pgstore.WithTable; "" for pgstore.DefaultTable): per batch of
// 100,000, one INSERT … SELECT of the template row joined with
// generate_series, every column copied but key (CloneKey, computed by the
// server: sha256) and token (fresh).
func Postgres(pool *pgxpool.Pool, table string) Cloner {
	if table == "" {
		table = "idem_records"
	}
	t := pgx.Identifier(strings.SplitN(table, ".", 2)).Sanitize()
	return func(ctx context.Context, template string, n int) error {
		rows, err := pool.Query(ctx, `SELECT * FROM `+t+` WHERE false`)
		if err != nil {
			return fmt.Errorf("history: postgres columns: %w", err)
		}
		fields := rows.FieldDescriptions()
		rows.Close()
		cols, vals := make([]string, len(fields)), make([]string, len(fields))
		for i, f := range fields {
			cols[i] = pgx.Identifier{f.Name}.Sanitize()
			switch f.Name {
			case "key":
				vals[i] = `encode(sha256(convert_to($1::text || ':' || g::text, 'UTF8')), 'hex')`
			case "token":
				vals[i] = `left(encode(sha256(convert_to($1::text || ':t:' || g::text, 'UTF8')), 'hex'), 32)`
			default:
				vals[i] = "r." + cols[i]
			}
		}
		q := `INSERT INTO ` + t + ` (` + strings.Join(cols, ", ") + `) SELECT ` + strings.Join(vals, ", ") +
			` FROM ` + t + ` r, generate_series($2::bigint, $3::bigint) g WHERE r.key = $1`
		for from := 1; from <= n; from += sqlBatch {
			to := min(from+sqlBatch-1, n)
			tag, err := pool.Exec(ctx, q, template, from, to)
			if err != nil {
				return fmt.Errorf("history: postgres copies %d-%d: %w", from, to, err)
			}
			if got := tag.RowsAffected(); got != int64(to-from+1) {
				return fmt.Errorf("history: postgres copies %d-%d: %d rows inserted (template %s absent?)", from, to, got, template)
			}
		}
		return nil
	}
}

// MySQL returns the [Cloner] of a mysqlstore.Store on db and table (as
// given to mysqlstore.WithTable; "" for mysqlstore.DefaultTable): per batch
// of 100,000, one INSERT … SELECT of the template row joined with a
// generated sequence (a cross join of digits: MySQL and MariaDB alike),
// every column copied but key (CloneKey, computed by the server: SHA2) and
// token (fresh).
func MySQL(db *sql.DB, table string) Cloner {
	if table == "" {
		table = "idem_records"
	}
	parts := strings.SplitN(table, ".", 2)
	for i, p := range parts {
		parts[i] = "`" + strings.ReplaceAll(p, "`", "``") + "`"
	}
	t := strings.Join(parts, ".")
	return func(ctx context.Context, template string, n int) error {
		rows, err := db.QueryContext(ctx, `SELECT * FROM `+t+` WHERE 1 = 0`)
		if err != nil {
			return fmt.Errorf("history: mysql columns: %w", err)
		}
		names, err := rows.Columns()
		_ = rows.Close()
		if err != nil {
			return fmt.Errorf("history: mysql columns: %w", err)
		}
		cols, vals := make([]string, len(names)), make([]string, len(names))
		for i, c := range names {
			cols[i] = "`" + strings.ReplaceAll(c, "`", "``") + "`"
			switch c {
			case "key":
				vals[i] = `SHA2(CONCAT(?, ':', o.n), 256)`
			case "token":
				vals[i] = `LEFT(SHA2(CONCAT(?, ':t:', o.n), 256), 32)`
			default:
				vals[i] = "r." + cols[i]
			}
		}
		digits := `(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
  UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)`
		seq := `(SELECT ? + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n FROM ` +
			digits + ` a, ` + digits + ` b, ` + digits + ` c, ` + digits + ` e, ` + digits + ` f) o`
		q := `INSERT INTO ` + t + ` (` + strings.Join(cols, ", ") + `) SELECT ` + strings.Join(vals, ", ") +
			` FROM ` + t + " r, " + seq + " WHERE r.`key` = ? AND o.n <= ?"
		for from := 1; from <= n; from += sqlBatch {
			to := min(from+sqlBatch-1, n)
			args := []any{}
			for _, c := range names {
				if c == "key" || c == "token" {
					args = append(args, template)
				}
			}
			args = append(args, from, template, to)
			res, err := db.ExecContext(ctx, q, args...)
			if err != nil {
				return fmt.Errorf("history: mysql copies %d-%d: %w", from, to, err)
			}
			got, err := res.RowsAffected()
			switch {
			case err != nil:
				return fmt.Errorf("history: mysql copies %d-%d: %w", from, to, err)
			case got != int64(to-from+1):
				return fmt.Errorf("history: mysql copies %d-%d: %d rows inserted (template %s absent?)", from, to, got, template)
			}
		}
		return nil
	}
}

// mongoBatch is how many documents one insertMany of [Mongo] carries.
const mongoBatch = 1000

// Mongo returns the [Cloner] of a mongostore.Store on coll: the template
// document read once, then insertMany (unordered) of copies in batches of
// 1,000, every field copied but _id (CloneKey), token and gen (fresh).
func Mongo(coll *mongo.Collection) Cloner {
	return func(ctx context.Context, template string, n int) error {
		var doc bson.D
		if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: template}}).Decode(&doc); err != nil {
			return fmt.Errorf("history: mongo template %s: %w", template, err)
		}
		for from := 1; from <= n; from += mongoBatch {
			to := min(from+mongoBatch-1, n)
			docs := make([]any, 0, to-from+1)
			for i := from; i <= to; i++ {
				c := make(bson.D, len(doc))
				for j, e := range doc {
					switch e.Key {
					case "_id":
						e.Value = CloneKey(template, i)
					case "token":
						e.Value = cloneToken(template, i)
					case "gen":
						e.Value = rand.Text()
					}
					c[j] = e
				}
				docs = append(docs, c)
			}
			if _, err := coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false)); err != nil {
				return fmt.Errorf("history: mongo copies %d-%d: %w", from, to, err)
			}
		}
		return nil
	}
}

// redisBatch is how many SETs one pipeline of [Redis] sends.
const redisBatch = 1000

// Redis returns the [Cloner] of a redisstore.Store on client (a Redis or a
// Redis Cluster client) and prefix (as given to redisstore.WithPrefix; ""
// for redisstore.DefaultPrefix): the template's value and remaining time
// to live read once, then pipelined SET prefix+CloneKey(template, i) value
// PX ttl in batches of 1,000. A completed record is one string value (see
// redisstore's doc); a template with a response key of its own (completed
// under idem.Keep.Tombstone) is refused.
func Redis(client redis.UniversalClient, prefix string) Cloner {
	if prefix == "" {
		prefix = "idem:"
	}
	return func(ctx context.Context, template string, n int) error {
		key := prefix + template
		val, err := client.Get(ctx, key).Result()
		if err != nil {
			return fmt.Errorf("history: redis template %s: %w", template, err)
		}
		ttl, err := client.PTTL(ctx, key).Result()
		switch {
		case err != nil:
			return fmt.Errorf("history: redis template %s: %w", template, err)
		case ttl <= 0:
			return fmt.Errorf("history: redis template %s: no time to live (%v)", template, ttl)
		case !strings.HasPrefix(val, "2"):
			return errors.New("history: redis template is not a completed record without a keep")
		}
		for from := 1; from <= n; from += redisBatch {
			to := min(from+redisBatch-1, n)
			_, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := from; i <= to; i++ {
					p.Set(ctx, prefix+CloneKey(template, i), val, ttl.Round(time.Millisecond))
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("history: redis copies %d-%d: %w", from, to, err)
			}
		}
		return nil
	}
}
