package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
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
	// hint says which flag names another layout.
	hint string
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

// openStore connects to the store named by o.store.
func openStore(ctx context.Context, o cmdFlags) (*backend, error) {
	u, err := url.Parse(o.store)
	if err != nil {
		return nil, fmt.Errorf("-store: %w", err)
	}
	switch u.Scheme {
	case "redis", "rediss":
		opts, err := redis.ParseURL(o.store)
		if err != nil {
			return nil, fmt.Errorf("-store: %w", err)
		}
		client := redis.NewClient(opts)
		s := redisstore.New(client, redisstore.WithPrefix(o.prefix))
		return &backend{in: s, ls: s,
			layout:   fmt.Sprintf("Redis keys %q (-prefix %q%s)", o.prefix+"*", o.prefix, defaultOrNot(o.prefix == redisstore.DefaultPrefix)),
			hint:     `if the service sets redisstore.WithPrefix, pass the same -prefix (the README's examples use "payments:idem:")`,
			storeKey: func(key string) string { return fmt.Sprintf("Redis key %s%s", o.prefix, key) },
			close:    func() { _ = client.Close() }}, nil
	case "mongodb", "mongodb+srv":
		db, coll, ok := strings.Cut(o.collection, ".")
		if !ok || db == "" || coll == "" {
			return nil, fmt.Errorf("-collection %q: want database.collection", o.collection)
		}
		client, err := mongo.Connect(options.Client().ApplyURI(o.store))
		if err != nil {
			return nil, fmt.Errorf("-store: %w", err)
		}
		s := mongostore.New(client.Database(db).Collection(coll))
		return &backend{in: s, ls: s,
			layout:   fmt.Sprintf("MongoDB collection %s (-collection%s)", o.collection, defaultOrNot(o.collection == defaultCollection)),
			hint:     "pass -collection database.collection, the collection the service gives mongostore.New (the README's example uses payments.idempotency)",
			storeKey: func(key string) string { return fmt.Sprintf("MongoDB %s, _id %s", o.collection, key) },
			close: func() {
				_ = s.Close()
				_ = client.Disconnect(context.WithoutCancel(ctx))
			}}, nil
	case "postgres", "postgresql":
		pool, err := pgxpool.New(ctx, o.store)
		if err != nil {
			return nil, fmt.Errorf("-store: %w", err)
		}
		s := pgstore.New(pool, pgstore.WithTable(o.table))
		return sqlBackend(s, "PostgreSQL", o.table, pgstore.DefaultTable, "pgstore", func() { _ = s.Close(); pool.Close() }), nil
	case "mysql":
		cfg, err := mysqlConfig(u)
		if err != nil {
			return nil, fmt.Errorf("-store: %w", err)
		}
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, fmt.Errorf("-store: %w", err)
		}
		db := sql.OpenDB(conn)
		s := mysqlstore.New(db, mysqlstore.WithTable(o.table))
		return sqlBackend(s, "MySQL", o.table, mysqlstore.DefaultTable, "mysqlstore", func() { _ = s.Close(); _ = db.Close() }), nil
	}
	return nil, fmt.Errorf("-store %q: want a redis://, rediss://, mongodb://, mongodb+srv://, postgres://, postgresql:// or mysql:// URL", o.store)
}

// sqlStore is what idemctl needs of pgstore and mysqlstore.
type sqlStore interface {
	idem.Inspector
	idem.Lister
}

func sqlBackend(s sqlStore, server, table, defaultTable, pkg string, closeFn func()) *backend {
	return &backend{in: s, ls: s,
		layout:   fmt.Sprintf("%s table %s (-table%s)", server, table, defaultOrNot(table == defaultTable)),
		hint:     "if the service sets " + pkg + ".WithTable, pass the same -table (table or schema.table)",
		storeKey: func(key string) string { return fmt.Sprintf("%s table %s, key %s", server, table, key) },
		close:    closeFn}
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
