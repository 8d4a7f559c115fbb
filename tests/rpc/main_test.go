package rpc

import (
	"context"
	"crypto/rand"
	"flag"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	tpclient "github.com/Shopify/toxiproxy/v2/client"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

var toxiAPI *http.Server

func TestMain(m *testing.M) {
	if door := os.Getenv(restartServerEnv); door != "" { // this binary run as a server process (restart_test.go)
		os.Exit(runRestartServer(door))
	}
	flag.Parse()
	// The restart tests mostly wait (for a server process to be down, for
	// a lease to lapse), not on the CPU: run them side by side.
	if f := flag.Lookup("test.parallel"); f != nil && f.Value.String() == strconv.Itoa(runtime.GOMAXPROCS(0)) {
		_ = f.Value.Set("8")
	}
	code := m.Run()
	if toxiAPI != nil {
		_ = toxiAPI.Close()
	}
	if code == 0 {
		// toxiproxy's own links can stay blocked on a channel send after
		// toxics were toggled on a closing connection (its goroutines, not
		// ours); everything else must be gone.
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/stream.(*ChanWriter).Write"),
			goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
			goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read")); err != nil {
			println("goleak:", err.Error())
			code = 1
		}
	}
	os.Exit(code)
}

// storeKinds are the stores every behaviour test runs on.
var storeKinds = []string{"memory", "redis", "postgres"}

// redisAddr is the host:port of IDEM_REDIS_URL (default 127.0.0.1:6379).
func redisOptions(t testing.TB) *redis.Options {
	u := os.Getenv("IDEM_REDIS_URL")
	if u == "" {
		u = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatalf("IDEM_REDIS_URL %q: %v", u, err)
	}
	opt.ContextTimeoutEnabled = true
	return opt
}

// newStore returns a store of kind; Redis ones use a fresh key prefix (and
// addr, when not empty, instead of IDEM_REDIS_URL's: a proxy).
func newStore(t testing.TB, kind, addr string) idem.Store {
	t.Helper()
	switch kind {
	case "memory":
		s := memstore.New()
		t.Cleanup(func() { _ = s.Close() })
		return s
	case "redis":
		opt := redisOptions(t)
		if addr != "" {
			opt.Addr = addr
			opt.MaxRetries = -1
		}
		c := redis.NewClient(opt)
		t.Cleanup(func() { _ = c.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("redis at %s: %v (set IDEM_REDIS_URL; source scripts/services.sh)", opt.Addr, err)
		}
		return redisstore.New(c, redisstore.WithPrefix("idemtest:rpc:"+rand.Text()[:10]+":"))
	case "postgres":
		u := os.Getenv("IDEM_POSTGRES_URL")
		if u == "" {
			u = "postgres://postgres@127.0.0.1:5432/test"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool, err := pgxpool.New(ctx, u)
		if err != nil {
			t.Fatalf("IDEM_POSTGRES_URL %q: %v", u, err)
		}
		table := "idem_rpc_" + strings.ToLower(rand.Text()[:10])
		s := pgstore.New(pool, pgstore.WithTable(table))
		if err := s.EnsureSchema(ctx); err != nil {
			pool.Close()
			t.Fatalf("postgres at %s: %v (source scripts/services.sh)", u, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
			pool.Close()
		})
		return s
	}
	t.Fatalf("unknown store %q", kind)
	return nil
}

// newEngine returns an engine over store, closed at cleanup.
func newEngine(t testing.TB, store idem.Store, opts ...idem.Option) *idem.Engine {
	t.Helper()
	opts = append([]idem.Option{idem.WithRetention(10 * time.Minute), idem.WithStoreTimeout(500 * time.Millisecond), idem.WithLease(5 * time.Second),
		idem.WithCompletionRetry(0)}, opts...)
	e, err := idem.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.Close(ctx)
	})
	return e
}

var (
	toxiOnce   sync.Once
	toxiClient *tpclient.Client
	toxiErr    error
)

// newProxy returns a toxiproxy proxy from a free loopback port to upstream,
// deleted at cleanup.
func newProxy(t *testing.T, upstream string) *tpclient.Proxy {
	t.Helper()
	toxiOnce.Do(func() {
		api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			toxiErr = err
			return
		}
		toxiAPI = &http.Server{Handler: api.Routes(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = toxiAPI.Serve(ln) }()
		toxiClient = tpclient.NewClient(ln.Addr().String())
	})
	if toxiErr != nil {
		t.Fatal(toxiErr)
	}
	name := strings.NewReplacer("/", "_", " ", "_", "#", "_").Replace(strings.ToLower(t.Name())) + "_" + rand.Text()[:6]
	p, err := toxiClient.CreateProxy(name, "127.0.0.1:0", upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Delete() })
	return p
}

// idemRetryAfter3s makes in-progress answers carry a 3s retry delay.
var idemRetryAfter3s = idem.WithRetryAfter(3 * time.Second)
