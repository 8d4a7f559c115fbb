// Command webhooks is a payments service receiving webhooks from two
// senders, each event processed once however often it is delivered: a
// Stripe endpoint (Stripe-Signature) and a Standard Webhooks endpoint
// ("billing", as Svix-based senders sign). Run it with one command:
//
//	go run ./examples/webhooks
//
// It starts the receiver on a loopback port, then plays the senders: every
// event is delivered several times at once (a sender's duplicates), each
// copy retried on every non-2xx answer (signed anew each time, as senders
// do) until it gets a 2xx; one delivery gives up mid-processing (a cut
// connection) and is redelivered; a forged and a replayed-old delivery are
// thrown in. It prints each answer, then the events processed, and exits
// non-zero unless every event was processed exactly once.
//
//	go run ./examples/webhooks -serve 127.0.0.1:8090   # only the receiver, until SIGINT
//	go run ./examples/webhooks -store redis            # records in Redis (-redis URL)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// The senders' signing secrets (in a real service: from the senders'
// dashboards, through the environment).
const (
	stripeSecret  = "whsec_example_stripe_endpoint_secret"
	billingSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)

type options struct {
	serve, store, redisURL string
	redisPrefix            string
	events, copies         int
	processing             time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.serve, "serve", "", "serve the receiver on this address until SIGINT or SIGTERM, without simulated senders")
	flag.StringVar(&o.store, "store", "memory", "memory or redis")
	flag.StringVar(&o.redisURL, "redis", envOr("IDEM_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL, with -store redis")
	flag.StringVar(&o.redisPrefix, "redis-prefix", "idem-example-webhooks:", "prefix of the records' Redis keys")
	flag.IntVar(&o.events, "events", 3, "events per sender")
	flag.IntVar(&o.copies, "copies", 3, "deliveries of each event sent at once")
	flag.DurationVar(&o.processing, "processing", 300*time.Millisecond, "how long processing one event takes")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// run serves the receiver and, unless o.serve is set, plays the senders
// against it and checks that each event was processed exactly once.
func run(ctx context.Context, o options, out io.Writer) error {
	store, closeStore, err := openStore(ctx, o)
	if err != nil {
		return err
	}
	defer closeStore()
	// Senders retry for days (Stripe: 3): the records must outlast that.
	engine, err := idem.New(store, idem.WithRetention(4*24*time.Hour))
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = engine.Close(cctx)
	}()
	rc, err := newReceiver(engine, o.processing)
	if err != nil {
		return err
	}
	addr := o.serve
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: rc.routes(), ReadHeaderTimeout: 10 * time.Second}
	var serveErr error
	served := make(chan struct{})
	go func() { serveErr = srv.Serve(ln); close(served) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-served
	}()
	base := "http://" + ln.Addr().String()
	if o.serve != "" {
		fmt.Fprintf(out, "receiving on %s/webhooks/stripe and %s/webhooks/billing\n", base, base)
		select {
		case <-ctx.Done():
			return nil
		case <-served:
			return serveErr
		}
	}
	fmt.Fprintf(out, "receiver on %s (%s store); senders delivering %d events each, %d copies at once\n", base, o.store, o.events, o.copies)
	sent, err := simulateSenders(ctx, base, o, out)
	if err != nil {
		return err
	}
	return rc.report(out, sent)
}

func openStore(ctx context.Context, o options) (idem.Store, func(), error) {
	switch o.store {
	case "memory":
		s := memstore.New()
		return s, func() { _ = s.Close() }, nil
	case "redis":
		opt, err := redis.ParseURL(o.redisURL)
		if err != nil {
			return nil, nil, err
		}
		c := redis.NewClient(opt)
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := c.Ping(pctx).Err(); err != nil {
			_ = c.Close()
			return nil, nil, fmt.Errorf("redis %s: %w", o.redisURL, err)
		}
		return redisstore.New(c, redisstore.WithPrefix(o.redisPrefix)), func() { _ = c.Close() }, nil
	}
	return nil, nil, errors.New("-store must be memory or redis")
}
