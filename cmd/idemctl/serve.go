package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemui"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/redisstore"
)

const serveUsage = `usage: idemctl serve -store ADDR [-addr HOST:PORT] [-token TOKEN] [flags]

serve runs the operator's console (observability/idemui) on the store until
it is interrupted: records by state, one record with its steps, and, with a
token, the actions (resolve a step, complete, release, evict) after a
confirmation, each logged on stderr as an audit event. Without a token the
console is read-only and open to whoever reaches -addr (127.0.0.1 by
default); with one, every page needs a login with it.

Flags:
`

// tokenEnv is the environment variable serve reads its token from when
// -token is not given (a command line is visible to every local user).
const tokenEnv = "IDEMCTL_TOKEN" //nolint:gosec // a variable's name, not a credential

// storeFlags defines the flags that name the store and its layout.
func storeFlags(fs *flag.FlagSet, o *cmdFlags) {
	fs.StringVar(&o.store, "store", "", "the store's address as the service is given it: "+storeForms)
	fs.StringVar(&o.prefix, "prefix", redisstore.DefaultPrefix, "Redis key prefix of the store (redisstore.WithPrefix)")
	fs.StringVar(&o.collection, "collection", defaultCollection, "MongoDB database.collection of the store (the collection given to mongostore.New)")
	fs.StringVar(&o.table, "table", mysqlstore.DefaultTable, "SQL table of the store, table or schema.table (pgstore.WithTable, mysqlstore.WithTable)")
}

// serve runs `idemctl serve`: args without "serve".
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemctl serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, serveUsage)
		fs.PrintDefaults()
	}
	var o cmdFlags
	var addr, token string
	var showBodies bool
	storeFlags(fs, &o)
	fs.StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on (port 0: any free port, printed)")
	fs.StringVar(&token, "token", "", "the console's login token, at least 16 characters: enables the actions ($"+tokenEnv+" when not given)")
	fs.DurationVar(&o.lease.lease, "lease", idem.DefaultLease, "the service's lease (idem.WithLease), to tell a holder that renews from one that stopped")
	fs.DurationVar(&o.lease.storeTimeout, "store-timeout", idem.DefaultStoreTimeout, "the service's store timeout (idem.WithStoreTimeout)")
	fs.DurationVar(&o.retention, "retention", idem.DefaultRetention, "the service's retention (idem.WithRetention): complete's default")
	fs.BoolVar(&showBodies, "show-bodies", false, "show the bodies of stored answers (they may hold personal data)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if token == "" {
		token = os.Getenv(tokenEnv)
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "idemctl serve: unexpected arguments %q\n", fs.Args())
		return exitUsage
	case o.store == "":
		fmt.Fprintln(stderr, "idemctl serve: -store is required")
		return exitUsage
	case token != "" && len(token) < 16:
		fmt.Fprintln(stderr, "idemctl serve: -token needs at least 16 characters")
		return exitUsage
	case o.lease.lease <= 0 || o.lease.storeTimeout <= 0 || o.retention <= 0:
		fmt.Fprintln(stderr, "idemctl serve: -lease, -store-timeout and -retention must be > 0")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	b, err := open(openCtx, o)
	cancel()
	if err != nil {
		fmt.Fprintln(stderr, "idemctl serve:", err)
		return exitUsage
	}
	defer b.close()
	store, ok := b.in.(idem.Store)
	if !ok {
		fmt.Fprintf(stderr, "idemctl serve: %s is not an idem.Store\n", b.layout)
		return exitUsage
	}
	opts := []idemui.Option{idemui.WithLease(o.lease.lease, o.lease.storeTimeout), idemui.WithRetention(o.retention),
		idemui.WithLogger(slog.New(slog.NewTextHandler(stderr, nil)))}
	if token != "" {
		opts = append(opts, idemui.WithToken(token), idemui.WithWrites(nil))
	}
	if showBodies {
		opts = append(opts, idemui.ShowBodies())
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl serve:", err)
		return exitFail
	}
	srv := &http.Server{Handler: idemui.Handler(store, opts...), ReadHeaderTimeout: 10 * time.Second}
	mode := "read-only (no -token)"
	if token != "" {
		mode = "actions enabled, login with the token"
	}
	fmt.Fprintf(stdout, "idemctl: console of %s at http://%s/ (%s)\n", b.layout, ln.Addr(), mode)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err = srv.Shutdown(shutdown)
		cancel()
		if serr := <-done; err == nil {
			err = serr
		}
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(stderr, "idemctl serve:", err)
		return exitFail
	}
	return exitOK
}
