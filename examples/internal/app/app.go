// Package app is what every example service shares besides its framework
// wiring: flags, opening the chosen store, the engine, and serving until a
// signal.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/internal/payments"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/mongostore"
	"github.com/idemkit/idem/stores/redisstore"
)

// Config holds the flags every example accepts.
type Config struct {
	Addr          string
	Store         string // memory, redis or mongo
	RedisURL      string
	MongoURI      string
	ChargeLatency time.Duration
	TTL           time.Duration
	Lease         time.Duration
	NoIdem        bool
	// StoreTimeout bounds every store operation (idem.WithStoreTimeout).
	StoreTimeout time.Duration
	// RedisWaitReplicas > 0 makes completions wait for that many Redis
	// replicas (redisstore.WithWaitReplicas, default WAIT timeout).
	RedisWaitReplicas int
}

// ParseFlags parses the command line shared by the examples.
func ParseFlags() Config {
	var c Config
	flag.StringVar(&c.Addr, "addr", "127.0.0.1:8080", "listen address (port 0 picks a free one)")
	flag.StringVar(&c.Store, "store", "memory", "idempotency store: memory, redis or mongo")
	flag.StringVar(&c.RedisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis URL for -store redis; with a master_name parameter, Sentinel addresses (redis://SENTINEL?master_name=M&addr=SENTINEL2...)")
	flag.StringVar(&c.MongoURI, "mongo-uri", "mongodb://127.0.0.1:27017/", "MongoDB URI for -store mongo")
	flag.DurationVar(&c.ChargeLatency, "charge-latency", 50*time.Millisecond, "simulated payment provider latency")
	flag.DurationVar(&c.TTL, "ttl", idem.DefaultRetention, "retention of stored responses")
	flag.DurationVar(&c.Lease, "lease", idem.DefaultLease, "lease of an in-progress request")
	flag.BoolVar(&c.NoIdem, "no-idem", false, "serve without idempotency (for benchmarks only)")
	flag.DurationVar(&c.StoreTimeout, "store-timeout", idem.DefaultStoreTimeout, "bound on every store operation")
	flag.IntVar(&c.RedisWaitReplicas, "redis-wait-replicas", 0, "with -store redis: replicas that must acknowledge each completion (Redis WAIT)")
	flag.Parse()
	return c
}

// Deps is what a framework's wiring receives.
type Deps struct {
	Payments *payments.Service
	// Engine is nil with -no-idem.
	Engine *idem.Engine
}

// Server is an HTTP server bound by Run: *http.Server, or a small wrapper
// around a framework with its own server (Fiber).
type Server interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
}

// Run opens the store, builds the engine and the server with build, prints
// "listening on http://ADDR" once it accepts connections, and serves until
// SIGINT or SIGTERM. A store that is unreachable at start-up does not stop
// the service: protected routes answer 503 until it comes back.
func Run(c Config, build func(Deps) Server) {
	if err := run(c, build); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(c Config, build func(Deps) Server) error {
	store, closeStore, err := OpenStore(c)
	if err != nil {
		return err
	}
	defer closeStore()
	deps := Deps{Payments: payments.New(c.ChargeLatency)}
	if !c.NoIdem {
		deps.Engine, err = idem.New(store, idem.WithRetention(c.TTL), idem.WithLease(c.Lease), idem.WithStoreTimeout(c.StoreTimeout))
		if err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return err
	}
	srv := build(deps)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("listening on http://%s\n", ln.Addr()) // after the signal handler: a SIGTERM from now on shuts down cleanly
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	if deps.Engine != nil { // let completions that hit a store error finish retrying
		if err := deps.Engine.Close(shutdown); err != nil {
			slog.Warn("idem: completions still retrying were abandoned", "err", err)
		}
	}
	// The final count, for tests that stop instances and still count every
	// execution (tests/chaos).
	fmt.Printf("executions %d\n", deps.Payments.Stats().Executions)
	return nil
}

// HTTPServer wraps an http.Handler for Run.
func HTTPServer(h http.Handler) Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
}

// OpenStore opens the store named by c.Store without waiting for its server:
// the clients connect lazily and reconnect on their own.
func OpenStore(c Config) (idem.Store, func(), error) {
	switch c.Store {
	case "memory":
		s := memstore.New()
		return s, func() { s.Close() }, nil
	case "redis":
		client, err := redisClient(c.RedisURL)
		if err != nil {
			return nil, nil, fmt.Errorf("-redis-url: %w", err)
		}
		var ropts []redisstore.Option
		if c.RedisWaitReplicas > 0 {
			ropts = append(ropts, redisstore.WithWaitReplicas(c.RedisWaitReplicas, 0))
		}
		return redisstore.New(client, ropts...), func() { client.Close() }, nil
	case "mongo":
		client, err := mongo.Connect(options.Client().ApplyURI(c.MongoURI).SetServerSelectionTimeout(2 * time.Second))
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
	}
	return nil, nil, fmt.Errorf("-store %q: want memory, redis or mongo", c.Store)
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
