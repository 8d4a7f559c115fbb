package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mongostore"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// defaultCollection is -collection's default: mongostore.New takes the
// collection from its caller, so it has none; this one is the examples'.
const defaultCollection = "idem.idempotency"

// backend is an opened store: its Inspector (and Lister, nil if it has
// none), where it keeps records, and how to release its client.
type backend struct {
	in idem.Inspector
	ls idem.Lister
	kp idem.Keeper // nil when the store keeps no uncertain records
	// layout names where the records are, e.g. `Redis keys "idem:*"`.
	layout string
	// hints returns what is true about the layout when a record is not
	// found: that the table or collection does not exist, that no key has
	// the prefix, that the server may evict records. It is called only
	// then, and says nothing it did not check.
	hints func(ctx context.Context) []string
	// storeKey returns where the store keeps a scoped key's record.
	storeKey func(key string) string
	close    func()
}

// open returns the store named by o.store.
func open(ctx context.Context, o cmdFlags) (*backend, error) {
	b, err := openStore(ctx, o)
	if err == nil {
		b.kp, _ = b.in.(idem.Keeper)
	}
	return b, err
}

// storeForms is the -store usage: the address forms the services take.
const storeForms = `a Redis URL (redis://[user:password@]host:port/db, rediss:// for TLS, ?master_name=M for Sentinel), ` +
	`a MongoDB URI (mongodb://host/, mongodb+srv://), a PostgreSQL URL or keyword/value DSN as pgx takes them ` +
	`(postgres://user@host:5432/db, postgresql://, "host=H user=U dbname=D"), or a MySQL/MariaDB DSN as go-sql-driver takes it ` +
	`(user:password@tcp(host:3306)/db) or mysql://user:password@host:port/db`

// openStore connects to the store named by o.store: the address the
// service itself is given (a go-sql-driver DSN, a pgx URL or DSN, a Redis
// URL, a MongoDB URI), or a mysql:// URL.
func openStore(ctx context.Context, o cmdFlags) (*backend, error) {
	scheme := ""
	if i := strings.Index(o.store, "://"); i > 0 {
		scheme = strings.ToLower(o.store[:i])
	}
	switch scheme {
	case "redis", "rediss":
		return openRedis(o)
	case "mongodb", "mongodb+srv":
		return openMongo(ctx, o)
	case "postgres", "postgresql":
		return openPostgres(ctx, o)
	case "mysql":
		u, err := url.Parse(o.store)
		if err != nil {
			return nil, fmt.Errorf("-store: %w", err)
		}
		cfg, err := mysqlConfig(u)
		if err != nil {
			return nil, fmt.Errorf("-store: %w", err)
		}
		return openMySQL(cfg, o)
	case "":
		// go-sql-driver's DSN, as the services' -mysql-dsn: [user[:password]@][net[(addr)]]/dbname[?params].
		if cfg, err := mysql.ParseDSN(o.store); err == nil && strings.Contains(o.store, "/") {
			if cfg.DBName == "" {
				return nil, fmt.Errorf("-store %q: the MySQL DSN names no database (user@tcp(host:3306)/database)", o.store)
			}
			return openMySQL(cfg, o)
		}
		if strings.Contains(o.store, "=") { // pgx's keyword/value DSN
			return openPostgres(ctx, o)
		}
	}
	return nil, fmt.Errorf("-store %q: want %s", o.store, storeForms)
}

func openRedis(o cmdFlags) (*backend, error) {
	var client *redis.Client
	if u, err := url.Parse(o.store); err == nil && u.Query().Has("master_name") { // Sentinel, as the services take it
		opts, err := redis.ParseFailoverURL(o.store)
		if err != nil {
			return nil, fmt.Errorf("-store: %w", err)
		}
		client = redis.NewFailoverClient(opts)
	} else {
		opts, err := redis.ParseURL(o.store)
		if err != nil {
			return nil, fmt.Errorf("-store: %w", err)
		}
		client = redis.NewClient(opts)
	}
	s := redisstore.New(client, redisstore.WithPrefix(o.prefix))
	b := &backend{in: s, ls: s,
		layout:   fmt.Sprintf("Redis keys %q (-prefix %q%s)", o.prefix+"*", o.prefix, defaultOrNot(o.prefix == redisstore.DefaultPrefix)),
		storeKey: func(key string) string { return fmt.Sprintf("Redis key %s%s", o.prefix, key) },
		close:    func() { _ = client.Close() }}
	b.hints = func(ctx context.Context) []string {
		var h []string
		if found, known := hasRecords(ctx, b.ls); known && !found {
			h = append(h, fmt.Sprintf(`no key starts with %q: if the service sets redisstore.WithPrefix, pass the same -prefix (the README's examples use "payments:idem:")`, o.prefix))
		}
		if evs, err := s.Eviction(ctx); err == nil {
			for _, e := range evs {
				if e.Evicts() {
					h = append(h, fmt.Sprintf("Redis at %s has maxmemory-policy %s (maxmemory %d bytes): it may have evicted the record before its TTL ended (redisstore's README: use noeviction)", e.Addr, e.Policy, e.MaxMemory))
				}
			}
		}
		return h
	}
	return b, nil
}

func openMongo(ctx context.Context, o cmdFlags) (*backend, error) {
	dbName, collName, ok := strings.Cut(o.collection, ".")
	if !ok || dbName == "" || collName == "" {
		return nil, fmt.Errorf("-collection %q: want database.collection", o.collection)
	}
	client, err := mongo.Connect(options.Client().ApplyURI(o.store))
	if err != nil {
		return nil, fmt.Errorf("-store: %w", err)
	}
	db := client.Database(dbName)
	s := mongostore.New(db.Collection(collName))
	return &backend{in: s, ls: s,
		layout:   fmt.Sprintf("MongoDB collection %s (-collection%s)", o.collection, defaultOrNot(o.collection == defaultCollection)),
		storeKey: func(key string) string { return fmt.Sprintf("MongoDB %s, _id %s", o.collection, key) },
		hints: func(ctx context.Context) []string {
			names, err := db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: collName}})
			if err != nil || len(names) > 0 {
				return nil
			}
			return []string{fmt.Sprintf("database %s has no collection %s: pass -collection database.collection, the collection the service gives mongostore.New (the README's example uses payments.idempotency)", dbName, collName)}
		},
		close: func() {
			_ = s.Close()
			_ = client.Disconnect(context.WithoutCancel(ctx))
		}}, nil
}

func openPostgres(ctx context.Context, o cmdFlags) (*backend, error) {
	pool, err := pgxpool.New(ctx, o.store)
	if err != nil {
		return nil, fmt.Errorf("-store: %w", err)
	}
	s := pgstore.New(pool, pgstore.WithTable(o.table))
	b := sqlBackend(s, "PostgreSQL", o.table, pgstore.DefaultTable, "pgstore", func() { _ = s.Close(); pool.Close() })
	quoted := pgx.Identifier(strings.SplitN(o.table, ".", 2)).Sanitize() // as pgstore.WithTable quotes it
	b.hints = tableHints(o.table, "pgstore", "the connection's search_path", func(ctx context.Context) (bool, error) {
		var exists bool
		err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, quoted).Scan(&exists)
		return exists, err
	})
	return b, nil
}

func openMySQL(cfg *mysql.Config, o cmdFlags) (*backend, error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("-store: %w", err)
	}
	db := sql.OpenDB(conn)
	s := mysqlstore.New(db, mysqlstore.WithTable(o.table))
	b := sqlBackend(s, "MySQL", o.table, mysqlstore.DefaultTable, "mysqlstore", func() { _ = s.Close(); _ = db.Close() })
	schema, table, qualified := strings.Cut(o.table, ".")
	if !qualified {
		schema, table = cfg.DBName, o.table
	}
	b.hints = tableHints(o.table, "mysqlstore", "database "+schema, func(ctx context.Context) (bool, error) {
		var n int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?`, schema, table).Scan(&n)
		return n > 0, err
	})
	return b, nil
}

// sqlStore is what idemctl needs of pgstore and mysqlstore.
type sqlStore interface {
	idem.Inspector
	idem.Lister
}

func sqlBackend(s sqlStore, server, table, defaultTable, pkg string, closeFn func()) *backend {
	return &backend{in: s, ls: s,
		layout:   fmt.Sprintf("%s table %s (-table%s)", server, table, defaultOrNot(table == defaultTable)),
		storeKey: func(key string) string { return fmt.Sprintf("%s table %s, key %s", server, table, key) },
		close:    closeFn}
}

// tableHints returns a backend's hints for a SQL store: the -table hint
// when, and only when, the table does not exist where the store looks.
func tableHints(table, pkg, where string, exists func(context.Context) (bool, error)) func(context.Context) []string {
	return func(ctx context.Context) []string {
		if ok, err := exists(ctx); err != nil || ok {
			return nil
		}
		return []string{fmt.Sprintf("table %s does not exist in %s: if the service sets %s.WithTable, pass the same -table (table or schema.table)", table, where, pkg)}
	}
}

// maxHintPages bounds the pages hasRecords reads (Redis pages may be
// empty batches of a large shared keyspace).
const maxHintPages = 20

// hasRecords reports whether the layout holds any record; known is false
// when the store could not tell (an error, or maxHintPages empty pages).
func hasRecords(ctx context.Context, ls idem.Lister) (found, known bool) {
	q := idem.ListQuery{Limit: 1}
	for range maxHintPages {
		page, err := ls.List(ctx, q)
		if err != nil {
			return false, false
		}
		if len(page.Records) > 0 {
			return true, true
		}
		if page.Next == "" {
			return false, true
		}
		q.Cursor = page.Next
	}
	return false, false
}

func defaultOrNot(isDefault bool) string {
	if isDefault {
		return ", the default"
	}
	return ""
}

// mysqlConfig turns mysql://[user[:password]@]host[:port]/database into
// the driver's configuration (TCP, port 3306 by default); query parameters
// are the driver's DSN parameters (e.g. tls=true).
func mysqlConfig(u *url.URL) (*mysql.Config, error) {
	db := strings.TrimPrefix(u.Path, "/")
	if u.Host == "" || db == "" || strings.Contains(db, "/") {
		return nil, errors.New("want mysql://[user[:password]@]host[:port]/database")
	}
	dsn := u.User.Username()
	if p, ok := u.User.Password(); ok {
		dsn += ":" + p
	}
	host := u.Host
	if u.Port() == "" {
		host += ":3306"
	}
	dsn += "@tcp(" + host + ")/" + db
	if u.RawQuery != "" {
		dsn += "?" + u.RawQuery
	}
	return mysql.ParseDSN(dsn)
}
