// This file is the same in every example folder (nethttp, gin, echo, echov5,
// fiber, fiberv3, grpc), so that each folder is a complete program you can
// copy: the command line, the store -store names (with its purger), and the
// payments ledger. TestCopiesInStep keeps the copies identical.

package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/mongostore"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// config is the command line.
type config struct {
	Addr          string
	Store         string // memory, redis, mongo, postgres or mysql
	RedisURL      string
	RedisPrefix   string // redisstore.WithPrefix
	MongoURI      string
	ChargeLatency time.Duration
	TTL           time.Duration // idem.WithRetention
	Lease         time.Duration // idem.WithLease
	StoreTimeout  time.Duration // idem.WithStoreTimeout
	// UncertainAfterCrash > 0 keeps a crashed request's key uncertain
	// that long (idem.WithUncertainAfterCrash); 0: takeover.
	UncertainAfterCrash time.Duration
	// RedisWaitReplicas > 0 makes completions wait for that many Redis
	// replicas (redisstore.WithWaitReplicas, default WAIT timeout).
	RedisWaitReplicas int
	NoIdem            bool   // serve without idempotency (the benchmarks' baseline)
	TraceFile         string // spans as JSON lines, see telemetry
	PostgresURL       string
	// PostgresSchema holds the tables idem_records (pgstore) and payments
	// (the ledger).
	PostgresSchema string
	// PaymentsPostgres records payments as rows in PostgreSQL with any
	// store (on its own connection unless -store postgres).
	PaymentsPostgres bool
	// MySQLDSN is the database (go-sql-driver DSN) of -store mysql: its
	// tables idem_records (mysqlstore) and payments, written through the
	// execution's transaction.
	MySQLDSN string
	// Test hooks (tests/chaos): NoRenewal hides the store's lease renewal
	// from the engine; PauseAfterRecord holds each handler after its
	// payment row is written, printing "paused", until SIGUSR1.
	NoRenewal        bool
	PauseAfterRecord bool
}

// parseFlags parses the command line.
func parseFlags() config {
	var f config
	flag.StringVar(&f.Addr, "addr", "127.0.0.1:8080", "listen address (port 0 picks a free one)")
	flag.StringVar(&f.Store, "store", "memory", "idempotency store: memory, redis, mongo, postgres or mysql")
	flag.StringVar(&f.RedisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis URL for -store redis; with a master_name parameter, Sentinel addresses (redis://SENTINEL?master_name=M&addr=SENTINEL2...)")
	flag.StringVar(&f.RedisPrefix, "redis-prefix", redisstore.DefaultPrefix, "prefix of every Redis key, for -store redis")
	flag.StringVar(&f.MongoURI, "mongo-uri", "mongodb://127.0.0.1:27017/", "MongoDB URI for -store mongo (database idem, collection idempotency)")
	flag.DurationVar(&f.ChargeLatency, "charge-latency", 50*time.Millisecond, "simulated payment provider latency")
	flag.DurationVar(&f.TTL, "ttl", idem.DefaultRetention, "retention of stored responses")
	flag.DurationVar(&f.Lease, "lease", idem.DefaultLease, "lease of an in-progress request")
	flag.DurationVar(&f.StoreTimeout, "store-timeout", idem.DefaultStoreTimeout, "bound on every store operation")
	flag.DurationVar(&f.UncertainAfterCrash, "uncertain-after-crash", 0, "keep a crashed request's key uncertain this long (409 operation-uncertain until idemctl resolves it); 0: the next retry takes over")
	flag.IntVar(&f.RedisWaitReplicas, "redis-wait-replicas", 0, "with -store redis: replicas that must acknowledge each completion (Redis WAIT)")
	flag.BoolVar(&f.NoIdem, "no-idem", false, "serve without idempotency (for benchmarks only)")
	flag.StringVar(&f.PostgresURL, "postgres-url", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL for -store postgres and -payments-postgres")
	flag.StringVar(&f.PostgresSchema, "postgres-schema", "public", "PostgreSQL schema of the tables idem_records and payments (created if missing)")
	flag.BoolVar(&f.PaymentsPostgres, "payments-postgres", false, "record payments as rows in PostgreSQL (always with -store postgres, through the execution's transaction)")
	flag.StringVar(&f.MySQLDSN, "mysql-dsn", "root@tcp(127.0.0.1:3306)/test", "MySQL/MariaDB DSN (go-sql-driver) for -store mysql: tables idem_records and payments (created if missing)")
	flag.BoolVar(&f.NoRenewal, "no-renewal", false, "test hook: never renew leases")
	flag.BoolVar(&f.PauseAfterRecord, "pause-after-record", false, "test hook: hold each handler after its payment row is written, print \"paused\", go on at SIGUSR1")
	flag.StringVar(&f.TraceFile, "trace-file", "", "write OpenTelemetry spans to this file, as JSON lines (default: no tracing)")
	flag.Parse()
	return f
}

// openStore opens the store f.Store names without waiting for its server:
// the clients connect lazily and reconnect on their own, so a store that is
// down at start-up makes protected routes answer 503 until it is back. The
// SQL stores start their purger, which deletes expired records (MongoDB's
// TTL index and Redis expiry do it themselves). The returned function stops
// the purger and closes the store and its client.
func openStore(f config) (idem.Store, func(), error) {
	s, closeStore, err := openNamedStore(f)
	if err != nil || !f.NoRenewal {
		return s, closeStore, err
	}
	// Test hook: hide Extend, keep the rest, so the engine never renews a lease.
	if tx, ok := s.(idem.Transactional); ok {
		return struct {
			idem.Store
			idem.Transactional
		}{s, tx}, closeStore, nil
	}
	return struct{ idem.Store }{s}, closeStore, nil
}

func openNamedStore(f config) (idem.Store, func(), error) {
	switch f.Store {
	case "memory":
		s := memstore.New()
		return s, func() { s.Close() }, nil
	case "redis":
		client, err := redisClient(f.RedisURL)
		if err != nil {
			return nil, nil, fmt.Errorf("-redis-url: %w", err)
		}
		ropts := []redisstore.Option{redisstore.WithPrefix(f.RedisPrefix)}
		if f.RedisWaitReplicas > 0 {
			ropts = append(ropts, redisstore.WithWaitReplicas(f.RedisWaitReplicas, 0))
		}
		return redisstore.New(client, ropts...), func() { client.Close() }, nil
	case "mongo":
		client, err := mongo.Connect(options.Client().ApplyURI(f.MongoURI).SetServerSelectionTimeout(2 * time.Second))
		if err != nil {
			return nil, nil, fmt.Errorf("-mongo-uri: %w", err)
		}
		s := mongostore.New(client.Database("idem").Collection("idempotency"))
		go func() { // index creation must not block start-up while the server is down
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := s.EnsureIndexes(ctx); err != nil {
				slog.Warn("mongostore: EnsureIndexes failed", "err", err)
			}
		}()
		return s, func() {
			s.Close()
			_ = client.Disconnect(context.Background())
		}, nil
	case "postgres":
		pool, err := openPostgres(f)
		if err != nil {
			return nil, nil, err
		}
		s := pgstore.New(pool, pgstore.WithTable(f.PostgresSchema+".idem_records"))
		if err := s.StartPurger(time.Hour); err != nil { // deletes expired rows; s.Close stops it
			return nil, nil, err
		}
		return s, func() { s.Close(); pool.Close() }, nil
	case "mysql":
		db, err := openMySQL(f)
		if err != nil {
			return nil, nil, err
		}
		s := mysqlstore.New(db)
		if err := s.StartPurger(time.Hour); err != nil { // deletes expired rows; s.Close stops it
			return nil, nil, err
		}
		return s, func() { _ = s.Close(); _ = db.Close() }, nil
	}
	return nil, nil, fmt.Errorf("-store %q: want memory, redis, mongo, postgres or mysql", f.Store)
}

// redisClient opens a client for u: a Sentinel failover client
// (redis.NewFailoverClient) when u has a master_name parameter, the
// sentinels being its host and its addr parameters (go-redis's
// ParseFailoverURL), else a plain client (ParseURL).
func redisClient(u string) (*redis.Client, error) {
	if pu, err := url.Parse(u); err == nil && pu.Query().Has("master_name") {
		opts, err := redis.ParseFailoverURL(u)
		if err != nil {
			return nil, err
		}
		opts.ContextTimeoutEnabled = true // the engine's store timeout reaches the socket
		return redis.NewFailoverClient(opts), nil
	}
	opts, err := redis.ParseURL(u)
	if err != nil {
		return nil, err
	}
	opts.ContextTimeoutEnabled = true
	return redis.NewClient(opts), nil
}

// openPostgres returns a pool on f.PostgresURL (it connects lazily) after
// creating the schema, idem_records and payments when they are missing;
// when the server is down at start-up it logs and goes on, and requests
// fail until the tables exist.
func openPostgres(f config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(context.Background(), f.PostgresURL)
	if err != nil {
		return nil, fmt.Errorf("-postgres-url: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	schema := pgx.Identifier{f.PostgresSchema}.Sanitize()
	exec := func(sql string) error { _, err := pool.Exec(ctx, sql); return err }
	err = errors.Join(
		exec(`CREATE SCHEMA IF NOT EXISTS `+schema),
		pgstore.New(pool, pgstore.WithTable(f.PostgresSchema+".idem_records")).EnsureSchema(ctx),
		exec(`CREATE TABLE IF NOT EXISTS `+schema+`.payments (
  id text PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL, currency text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now())`))
	if err != nil {
		slog.Warn("postgres: creating the tables failed; requests fail until they exist", "err", err)
	}
	return pool, nil
}

// openMySQL returns a *sql.DB on f.MySQLDSN (it connects lazily) after
// creating its database, idem_records (with its procedure) and payments
// when they are missing; when the server is down at start-up it logs and
// goes on, and requests fail until the tables exist.
func openMySQL(f config) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(f.MySQLDSN)
	if err != nil {
		return nil, fmt.Errorf("-mysql-dsn: %w", err)
	}
	cfg.Timeout = 2 * time.Second
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("-mysql-dsn: %w", err)
	}
	db := sql.OpenDB(conn)
	// One connection per running transactional execution, plus the store's
	// own calls.
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := createDatabase(ctx, *cfg); err != nil {
		slog.Warn("mysql: creating the database failed", "err", err)
	}
	_, perr := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS payments (\n"+
		"  id VARCHAR(64) PRIMARY KEY, user_id VARCHAR(255) NOT NULL, amount BIGINT NOT NULL, currency VARCHAR(8) NOT NULL,\n"+
		"  created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB")
	if err := errors.Join(mysqlstore.New(db).EnsureSchema(ctx), perr); err != nil {
		slog.Warn("mysql: creating the tables failed; requests fail until they exist", "err", err)
	}
	return db, nil
}

// createDatabase creates cfg's database if it is missing.
func createDatabase(ctx context.Context, cfg mysql.Config) error {
	name := cfg.DBName
	cfg.DBName = ""
	conn, err := mysql.NewConnector(&cfg)
	if err != nil {
		return err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	_, err = db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS `"+strings.ReplaceAll(name, "`", "``")+"`")
	return err
}

// openLedger returns the payments ledger f asks for: rows in the payments
// table written through the execution's transaction with -store postgres
// (pgstore.Tx) or -store mysql (mysqlstore.Tx), so that a payment row
// commits together with the stored response or not at all; on a pool of its
// own with -payments-postgres and another store; nil without either. The
// returned function closes what it opened.
func openLedger(f config) (Ledger, func(), error) {
	l := &sqlLedger{insert: `INSERT INTO ` + pgx.Identifier{f.PostgresSchema, "payments"}.Sanitize() +
		` (id, user_id, amount, currency) VALUES ($1, $2, $3, $4)`}
	closeLedger := func() {}
	switch {
	case f.Store == "postgres":
		l.write = func(ctx context.Context, sql string, args ...any) error {
			tx, err := pgstore.Tx(ctx) // the execution's transaction: committed with the completed record
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, sql, args...)
			return err
		}
	case f.Store == "mysql":
		l.insert = `INSERT INTO payments (id, user_id, amount, currency) VALUES (?, ?, ?, ?)`
		l.write = func(ctx context.Context, sql string, args ...any) error {
			tx, err := mysqlstore.Tx(ctx) // the execution's transaction: committed with the completed record
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, sql, args...)
			return err
		}
	case f.PaymentsPostgres:
		pool, err := openPostgres(f)
		if err != nil {
			return nil, nil, err
		}
		l.write = func(ctx context.Context, sql string, args ...any) error {
			_, err := pool.Exec(ctx, sql, args...) // committed at once, whatever becomes of the execution
			return err
		}
		closeLedger = pool.Close
	default:
		return nil, closeLedger, nil
	}
	if f.PauseAfterRecord {
		l.resume = make(chan os.Signal, 1)
		signal.Notify(l.resume, syscall.SIGUSR1)
	}
	return l, closeLedger, nil
}

// sqlLedger writes payment rows.
type sqlLedger struct {
	insert string
	write  func(ctx context.Context, sql string, args ...any) error
	resume chan os.Signal // -pause-after-record
}

// Record implements Ledger. Like the charge itself, the row is not
// abandoned when the client hangs up: the engine completes the execution
// anyway, so its writes must be there.
func (l *sqlLedger) Record(ctx context.Context, p Payment) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := l.write(ctx, l.insert, p.ID, p.UserID, p.Amount, p.Currency); err != nil {
		return err
	}
	if l.resume != nil {
		fmt.Println("paused", p.ID)
		<-l.resume
	}
	return nil
}
