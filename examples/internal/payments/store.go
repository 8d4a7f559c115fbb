package payments

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
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// Frameworks are the values of -framework: the doors the service is served
// through.
var Frameworks = []string{"nethttp", "gin", "echo", "echov5", "fiber", "fiberv3", "grpc"}

// Config is the command line.
type Config struct {
	// Framework is the door: one of Frameworks.
	Framework string
	Addr      string
	// GRPCAddr is grpc-go's listen address with -framework grpc (Addr
	// serves Connect and /metrics).
	GRPCAddr      string
	Store         string // memory, redis, mongo, postgres or mysql
	RedisURL      string
	RedisPrefix   string // redisstore.WithPrefix
	MongoURI      string
	MongoColl     string        // the collection of database idem, for -store mongo
	MongoDB       string        // the database of -store mongo's collection idempotency
	ChargeLatency time.Duration // every operation's provider call
	TTL           time.Duration // idem.WithRetention
	Lease         time.Duration // idem.WithLease
	StoreTimeout  time.Duration // idem.WithStoreTimeout
	// UncertainAfterCrash > 0 keeps a crashed request's key uncertain
	// that long (idem.WithUncertainAfterCrash); 0: takeover.
	UncertainAfterCrash time.Duration
	// RedisWaitReplicas > 0 makes completions wait for that many Redis
	// replicas (redisstore.WithWaitReplicas, default WAIT timeout).
	RedisWaitReplicas int
	NoIdem            bool   // serve without idempotency (the benchmarks' baseline, the demo's sign-up without idem)
	TraceFile         string // spans as JSON lines, see telemetry
	PostgresURL       string
	// PostgresSchema holds the tables idem_records (pgstore), payments and
	// signups (the ledger).
	PostgresSchema string
	// PaymentsPostgres records payments and sign-ups as rows in PostgreSQL
	// with any store (on its own connection unless -store postgres).
	PaymentsPostgres bool
	// MySQLDSN is the database (go-sql-driver DSN) of -store mysql: its
	// tables idem_records (mysqlstore), payments and signups, written
	// through the execution's transaction.
	MySQLDSN string
	// Test hooks (tests/chaos): NoRenewal hides the store's lease renewal
	// from the engine; PauseAfterRecord holds each handler after its
	// payment row is written, printing "paused", until SIGUSR1.
	NoRenewal        bool
	PauseAfterRecord bool
	// ProviderURL is examples/cardprovider's base URL: payments charge
	// it and mail a receipt through it, in durable steps (idem.Step); ""
	// simulates the provider in process.
	ProviderURL string
	// NoSteps makes -provider-url's calls without steps and without
	// idempotency keys (the control of the crash-point tests).
	NoSteps bool
	// PauseAt (test hook, with ProviderURL) holds each payment at that
	// point of PausePoints, printing "paused at POINT", until SIGUSR1.
	PauseAt string
	// CrashAt (test hook, with ProviderURL) makes every payment that
	// reaches that point of PausePoints kill its own process (SIGKILL):
	// a handler that always crashes.
	CrashAt string
	// Recover makes POST /v1/payments recoverable (idem.RouteRecovery)
	// and runs an idem.Recoverer in the instance, every RecoverEvery,
	// parking a record after RecoverAttempts runs.
	Recover         bool
	RecoverEvery    time.Duration
	RecoverAttempts int
	// RecoverConnect, with -framework grpc, runs recovered calls through
	// the Connect handler (idemconnect.Runner) instead of grpc-go's server
	// (idemgrpc.Runner).
	RecoverConnect bool
	// Outbox is the broker URL (nats://... or amqp://...) payment.created
	// events are relayed to through a transactional outbox (outbox.go);
	// OutboxName names the stream or queue, as examples/consumer's -name.
	Outbox, OutboxName string
	// ConsoleToken, when set, mounts the operator's console
	// (observability/idemui) on /admin/idem/ of the net/http wiring, its
	// pages and actions behind a login with this token.
	ConsoleToken string
}

// ParseFlags parses the command line; a -framework outside Frameworks is
// an error.
func ParseFlags() (Config, error) {
	var f Config
	flag.StringVar(&f.Framework, "framework", "nethttp", "the door: "+strings.Join(Frameworks, ", "))
	flag.StringVar(&f.Addr, "addr", "127.0.0.1:8080", "listen address (port 0 picks a free one)")
	flag.StringVar(&f.GRPCAddr, "grpc-addr", "127.0.0.1:9090", "with -framework grpc: grpc-go's listen address (port 0 picks a free one); -addr serves Connect")
	flag.StringVar(&f.Store, "store", "memory", "idempotency store: memory, redis, mongo, postgres or mysql")
	flag.StringVar(&f.RedisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis URL for -store redis; with a master_name parameter, Sentinel addresses (redis://SENTINEL?master_name=M&addr=SENTINEL2...)")
	flag.StringVar(&f.RedisPrefix, "redis-prefix", redisstore.DefaultPrefix, "prefix of every Redis key, for -store redis")
	flag.StringVar(&f.MongoURI, "mongo-uri", "mongodb://127.0.0.1:27017/", "MongoDB URI for -store mongo (collection -mongo-collection of database -mongo-db)")
	flag.StringVar(&f.MongoDB, "mongo-db", "idem", "MongoDB database of -store mongo's collection")
	flag.StringVar(&f.MongoColl, "mongo-collection", "idempotency", "collection of database -mongo-db for -store mongo")
	flag.DurationVar(&f.ChargeLatency, "charge-latency", 50*time.Millisecond, "simulated provider latency of every operation")
	flag.DurationVar(&f.TTL, "ttl", idem.DefaultRetention, "retention of stored responses")
	flag.DurationVar(&f.Lease, "lease", idem.DefaultLease, "lease of an in-progress request")
	flag.DurationVar(&f.StoreTimeout, "store-timeout", idem.DefaultStoreTimeout, "bound on every store operation")
	flag.DurationVar(&f.UncertainAfterCrash, "uncertain-after-crash", 0, "keep a crashed request's key uncertain this long (409 operation-uncertain until idemctl resolves it); 0: the next retry takes over")
	flag.IntVar(&f.RedisWaitReplicas, "redis-wait-replicas", 0, "with -store redis: replicas that must acknowledge each completion (Redis WAIT)")
	flag.BoolVar(&f.NoIdem, "no-idem", false, "serve without idempotency (the benchmarks' baseline, the demo's sign-up without idem)")
	flag.StringVar(&f.PostgresURL, "postgres-url", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL for -store postgres and -payments-postgres")
	flag.StringVar(&f.PostgresSchema, "postgres-schema", "public", "PostgreSQL schema of the tables idem_records, payments and signups (created if missing)")
	flag.BoolVar(&f.PaymentsPostgres, "payments-postgres", false, "record payments and sign-ups as rows in PostgreSQL (always with -store postgres, through the execution's transaction)")
	flag.StringVar(&f.MySQLDSN, "mysql-dsn", "root@tcp(127.0.0.1:3306)/test", "MySQL/MariaDB DSN (go-sql-driver) for -store mysql: tables idem_records, payments and signups (created if missing)")
	flag.BoolVar(&f.NoRenewal, "no-renewal", false, "test hook: never renew leases")
	flag.BoolVar(&f.PauseAfterRecord, "pause-after-record", false, "test hook: hold each handler after its payment row is written, print \"paused\", go on at SIGUSR1")
	flag.StringVar(&f.ProviderURL, "provider-url", "", "charge cards and mail receipts through examples/cardprovider at this URL (http://HOST:PORT), in durable steps; default: a provider simulated in process")
	flag.BoolVar(&f.NoSteps, "no-steps", false, "with -provider-url: call the provider without steps and without idempotency keys (a control: a crash mid-charge charges twice)")
	flag.StringVar(&f.PauseAt, "pause-at", "", "test hook, with -provider-url: hold each payment at this point ("+strings.Join(PausePoints, ", ")+"), print \"paused at POINT\", go on at SIGUSR1")
	flag.StringVar(&f.CrashAt, "crash-at", "", "test hook, with -provider-url: every payment reaching this point ("+strings.Join(PausePoints, ", ")+") kills the process (SIGKILL)")
	flag.BoolVar(&f.Recover, "recover", false, "make POST /v1/payments (and CreatePayment with -framework grpc) recoverable and run a recoverer in this instance: a payment whose instance crashed is finished without its client (README: Recovery without a client)")
	flag.DurationVar(&f.RecoverEvery, "recover-every", idem.DefaultRecoverInterval, "with -recover: how often the recoverer looks for lapsed payments (idem.RecoverEvery)")
	flag.BoolVar(&f.RecoverConnect, "recover-connect", false, "with -framework grpc -recover: run recovered calls through the Connect handler instead of grpc-go's server")
	flag.StringVar(&f.ConsoleToken, "console-token", os.Getenv("CONSOLE_TOKEN"), "with -framework nethttp: serve the operator's console on /admin/idem/, behind a login with this token (16 characters or more; default $CONSOLE_TOKEN)")
	flag.IntVar(&f.RecoverAttempts, "recover-attempts", idem.DefaultRecoverAttempts, "with -recover: recovery runs of a payment before it is parked uncertain (idem.RecoverAttempts)")
	flag.StringVar(&f.TraceFile, "trace-file", "", "write OpenTelemetry spans to this file, as JSON lines (default: no tracing)")
	// The transactional outbox (outbox.go).
	flag.StringVar(&f.Outbox, "outbox", "", "publish payment.created through a transactional outbox relayed to this broker: nats://HOST:PORT (JetStream) or amqp://USER:PASS@HOST:PORT/ (RabbitMQ); needs -store postgres, -store mysql or -payments-postgres")
	flag.StringVar(&f.OutboxName, "outbox-name", "payments", "with -outbox: the stream (upper-cased) or queue name, as examples/consumer's -name; the outbox table is <name>_events")
	flag.Parse()
	if !slices.Contains(Frameworks, f.Framework) {
		return f, fmt.Errorf("-framework %q: want one of %s", f.Framework, strings.Join(Frameworks, ", "))
	}
	return f, nil
}

// backing is what -store opened: the store, and its SQL database when it
// is one (the ledger writes there too).
type backing struct {
	store idem.Store
	pg    *pgxpool.Pool // -store postgres
	mysql *sql.DB       // -store mysql
	close func()        // stops the purger, closes the store and its client
}

// OpenStore opens the store f.Store names as the service does, for tests
// that look at its records (idem.Inspector, idem.Lister); close closes it.
func OpenStore(f Config) (store idem.Store, closeStore func(), err error) {
	b, err := openNamedStore(f)
	if err != nil {
		return nil, nil, err
	}
	return b.store, b.close, nil
}

// openStore opens the store f.Store names without waiting for its server:
// the clients connect lazily and reconnect on their own, so a store that is
// down at start-up makes protected routes answer 503 until it is back. The
// SQL stores start their purger, which deletes expired records (MongoDB's
// TTL index and Redis expiry do it themselves).
func openStore(f Config) (backing, error) {
	b, err := openNamedStore(f)
	if err != nil || !f.NoRenewal {
		return b, err
	}
	// Test hook: hide Extend, keep the rest, so the engine never renews a lease.
	if tx, ok := b.store.(idem.Transactional); ok {
		b.store = struct {
			idem.Store
			idem.Transactional
		}{b.store, tx}
		return b, nil
	}
	b.store = struct{ idem.Store }{b.store}
	return b, nil
}

func openNamedStore(f Config) (backing, error) {
	switch f.Store {
	case "memory":
		s := memstore.New()
		return backing{store: s, close: func() { s.Close() }}, nil
	case "redis":
		client, err := redisClient(f.RedisURL)
		if err != nil {
			return backing{}, fmt.Errorf("-redis-url: %w", err)
		}
		ropts := []redisstore.Option{redisstore.WithPrefix(f.RedisPrefix)}
		if f.RedisWaitReplicas > 0 {
			ropts = append(ropts, redisstore.WithWaitReplicas(f.RedisWaitReplicas, 0))
		}
		return backing{store: redisstore.New(client, ropts...), close: func() { client.Close() }}, nil
	case "mongo":
		client, err := mongo.Connect(options.Client().ApplyURI(f.MongoURI).SetServerSelectionTimeout(2 * time.Second))
		if err != nil {
			return backing{}, fmt.Errorf("-mongo-uri: %w", err)
		}
		db, coll := f.MongoDB, f.MongoColl
		if db == "" {
			db = "idem"
		}
		if coll == "" {
			coll = "idempotency"
		}
		s := mongostore.New(client.Database(db).Collection(coll))
		go func() { // index creation must not block start-up while the server is down
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := s.EnsureIndexes(ctx); err != nil {
				slog.Warn("mongostore: EnsureIndexes failed", "err", err)
			}
		}()
		return backing{store: s, close: func() {
			s.Close()
			_ = client.Disconnect(context.Background())
		}}, nil
	case "postgres":
		pool, err := openPostgres(f)
		if err != nil {
			return backing{}, err
		}
		s := pgstore.New(pool, pgstore.WithTable(f.PostgresSchema+".idem_records"))
		if err := s.StartPurger(time.Hour); err != nil { // deletes expired rows; s.Close stops it
			return backing{}, err
		}
		return backing{store: s, pg: pool, close: func() { s.Close(); pool.Close() }}, nil
	case "mysql":
		db, err := openMySQL(f)
		if err != nil {
			return backing{}, err
		}
		s := mysqlstore.New(db)
		if err := s.StartPurger(time.Hour); err != nil { // deletes expired rows; s.Close stops it
			return backing{}, err
		}
		return backing{store: s, mysql: db, close: func() { _ = s.Close(); _ = db.Close() }}, nil
	}
	return backing{}, fmt.Errorf("-store %q: want memory, redis, mongo, postgres or mysql", f.Store)
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
// creating the schema, idem_records, payments and signups when they are missing;
// when the server is down at start-up it logs and goes on, and requests
// fail until the tables exist.
func openPostgres(f Config) (*pgxpool.Pool, error) {
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
  created_at timestamptz NOT NULL DEFAULT now())`),
		exec(`CREATE TABLE IF NOT EXISTS `+schema+`.signups (
  id text PRIMARY KEY, email text NOT NULL UNIQUE, created_at timestamptz NOT NULL DEFAULT now())`))
	if err != nil {
		slog.Warn("postgres: creating the tables failed; requests fail until they exist", "err", err)
	}
	return pool, nil
}

// openMySQL returns a *sql.DB on f.MySQLDSN (it connects lazily) after
// creating its database, idem_records (with its procedure), payments
// and signups when they are missing; when the server is down at start-up it logs and
// goes on, and requests fail until the tables exist.
func openMySQL(f Config) (*sql.DB, error) {
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
	_, serr := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS signups (\n"+
		"  id VARCHAR(64) PRIMARY KEY, email VARCHAR(255) NOT NULL UNIQUE,\n"+
		"  created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB")
	if err := errors.Join(mysqlstore.New(db).EnsureSchema(ctx), perr, serr); err != nil {
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

// openLedger returns the ledger f asks for: rows in the payments and
// signups tables written through the execution's transaction with -store
// postgres (pgstore.Tx) or -store mysql (mysqlstore.Tx), so that a row
// commits together with the stored response or not at all (on the store's
// own pool when there is no execution: -no-idem); on a pool of its own with
// -payments-postgres and another store; nil without either (the service
// keeps everything in memory). The returned function closes what it opened.
func openLedger(f Config, b backing) (Ledger, func(), error) {
	payments := pgx.Identifier{f.PostgresSchema, "payments"}.Sanitize()
	signups := pgx.Identifier{f.PostgresSchema, "signups"}.Sanitize()
	l := &sqlLedger{
		insert: `INSERT INTO ` + payments + ` (id, user_id, amount, currency) VALUES ($1, $2, $3, $4)`,
		// ON CONFLICT DO NOTHING: the unique constraint still decides, and
		// the execution's transaction is not aborted by its error.
		signup: `INSERT INTO ` + signups + ` (id, email) VALUES ($1, $2) ON CONFLICT (email) DO NOTHING`,
	}
	closeLedger := func() {}
	var ledgerPG *pgxpool.Pool // the PostgreSQL ledger's pool, for -outbox
	pgWrite := func(pool *pgxpool.Pool) func(ctx context.Context, sql string, args ...any) (int64, error) {
		return func(ctx context.Context, sql string, args ...any) (int64, error) {
			var tag pgconn.CommandTag
			tx, err := pgstore.Tx(ctx) // the execution's transaction: committed with the completed record
			switch {
			case errors.Is(err, pgstore.ErrNoExecution) && pool != nil:
				tag, err = pool.Exec(ctx, sql, args...)
			case err == nil:
				tag, err = tx.Exec(ctx, sql, args...)
			}
			return tag.RowsAffected(), err
		}
	}
	switch {
	case f.Store == "postgres":
		l.write, ledgerPG = pgWrite(b.pg), b.pg
	case f.Store == "mysql":
		l.insert = `INSERT INTO payments (id, user_id, amount, currency) VALUES (?, ?, ?, ?)`
		l.signup = `INSERT INTO signups (id, email) VALUES (?, ?)`
		l.write = func(ctx context.Context, sql string, args ...any) (int64, error) {
			var res interface{ RowsAffected() (int64, error) }
			tx, err := mysqlstore.Tx(ctx) // the execution's transaction: committed with the completed record
			switch {
			case errors.Is(err, mysqlstore.ErrNoExecution):
				res, err = b.mysql.ExecContext(ctx, sql, args...)
			case err == nil:
				res, err = tx.ExecContext(ctx, sql, args...)
			}
			var me *mysql.MySQLError
			if errors.As(err, &me) && me.Number == 1062 { // ER_DUP_ENTRY: the unique constraint
				return 0, nil
			}
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		}
	case f.PaymentsPostgres:
		pool, err := openPostgres(f)
		if err != nil {
			return nil, nil, err
		}
		l.write = func(ctx context.Context, sql string, args ...any) (int64, error) {
			tag, err := pool.Exec(ctx, sql, args...) // committed at once, whatever becomes of the execution
			return tag.RowsAffected(), err
		}
		closeLedger, ledgerPG = pool.Close, pool
	case f.Outbox != "":
		return nil, nil, errors.New("-outbox needs a SQL ledger: -store postgres, -store mysql or -payments-postgres")
	default:
		return nil, closeLedger, nil
	}
	if f.Outbox != "" {
		stopOutbox, err := openOutbox(f, l, ledgerPG, b.mysql)
		if err != nil {
			closeLedger()
			return nil, nil, err
		}
		closeAll := closeLedger
		closeLedger = func() { stopOutbox(); closeAll() }
	}
	if f.PauseAfterRecord {
		l.resume = make(chan os.Signal, 1)
		signal.Notify(l.resume, syscall.SIGUSR1)
	}
	return l, closeLedger, nil
}

// sqlLedger writes payment and signup rows.
type sqlLedger struct {
	insert, signup string
	// write runs sql and returns the rows it inserted (0 when the signups
	// table's unique constraint refused the row).
	write  func(ctx context.Context, sql string, args ...any) (int64, error)
	resume chan os.Signal // -pause-after-record
	events *events        // -outbox
}

// Record implements Ledger. Like the charge itself, the row is not
// abandoned when the client hangs up: the engine completes the execution
// anyway, so its writes must be there.
func (l *sqlLedger) Record(ctx context.Context, p Payment) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var err error
	if l.events != nil {
		err = l.events.record(ctx, l.insert, p) // the row and its payment.created event, in one transaction
	} else {
		_, err = l.write(ctx, l.insert, p.ID, p.UserID, p.Amount, p.Currency)
	}
	if err != nil {
		return err
	}
	if l.resume != nil {
		fmt.Println("paused", p.ID)
		<-l.resume
	}
	return nil
}

// SignUp implements Ledger: ErrEmailTaken when the unique constraint on
// signups.email refuses the row.
func (l *sqlLedger) SignUp(ctx context.Context, a Account) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	n, err := l.write(ctx, l.signup, a.ID, a.Email)
	if err == nil && n == 0 {
		return ErrEmailTaken
	}
	return err
}
