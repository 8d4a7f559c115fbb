package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mongostore"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/redisstore"
)

const usage = `usage: idemctl show|evict -store URL [flags]

Shows the idempotency record of one request, or evicts it after a
confirmation. The record is named by the scope and key of the request
(-principal, -method, -route, -key) or by its scoped key (-scoped-key, as
traces carry it in idem.scoped_key).

Flags:
`

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // no record, not evicted, or a store error
	exitUsage = 2
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

type cmdFlags struct {
	store, prefix, collection, table   string
	principal, method, route, key, hex string
	yes                                bool
	timeout                            time.Duration
}

// run is the whole command: args without the program name; it returns the
// exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	var o cmdFlags
	fs.StringVar(&o.store, "store", "", "store URL: redis://[user:password@]host:port/db (rediss:// for TLS), mongodb://host/ (mongodb+srv:// too) or mysql://[user:password@]host[:port]/database")
	fs.StringVar(&o.prefix, "prefix", redisstore.DefaultPrefix, "Redis key prefix of the store (redisstore.WithPrefix)")
	fs.StringVar(&o.collection, "collection", "idem.idempotency", "MongoDB database.collection of the store")
	fs.StringVar(&o.table, "table", mysqlstore.DefaultTable, "MySQL table of the store, table or database.table (mysqlstore.WithTable)")
	fs.StringVar(&o.principal, "principal", "", "principal the adapter's scope function returned (empty with idem.WithGlobalScope)")
	fs.StringVar(&o.method, "method", "POST", "HTTP method")
	fs.StringVar(&o.route, "route", "", "route template as the adapter reports it, e.g. /v1/payments/:id (the request path if it reports none)")
	fs.StringVar(&o.key, "key", "", "Idempotency-Key header value as the client sent it")
	fs.StringVar(&o.hex, "scoped-key", "", "scoped key (64 hex characters) instead of -principal, -method, -route and -key")
	fs.BoolVar(&o.yes, "yes", false, "evict without asking for confirmation")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "bound on the whole command")
	if len(args) == 0 || (args[0] != "show" && args[0] != "evict") {
		fs.Usage()
		return exitUsage
	}
	cmd := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	key, err := o.scopedKey()
	if err == nil && o.store == "" {
		err = errors.New("-store is required")
	}
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	in, closeStore, err := open(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		return exitUsage
	}
	defer closeStore()

	info, found, err := in.Inspect(ctx, key)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl: inspect:", err)
		return exitFail
	}
	if !found {
		fmt.Fprintf(stdout, "scoped key   %s\nno live record: the key is absent or expired (a request with it executes)\n", key)
		return exitFail
	}
	printRecord(stdout, key, info, time.Now())
	if cmd == "show" {
		return exitOK
	}
	if !o.yes && !confirm(stdin, stdout, info.State) {
		fmt.Fprintln(stdout, "not evicted")
		return exitFail
	}
	switch err := in.Evict(ctx, key, info.Record); {
	case errors.Is(err, idem.ErrRecordChanged):
		fmt.Fprintln(stdout, "not evicted: the record changed since it was shown (it completed, changed owner or expired); run idemctl show again")
		return exitFail
	case err != nil:
		fmt.Fprintln(stderr, "idemctl: evict:", err)
		return exitFail
	}
	fmt.Fprintln(stdout, "evicted: a request with this key executes again")
	return exitOK
}

// scopedKey returns the key the store holds: -scoped-key, or the one the
// engine computes from the scope and the idempotency key (idem.ScopedKey).
func (o *cmdFlags) scopedKey() (string, error) {
	if o.hex != "" {
		if len(o.hex) != 64 || strings.Trim(strings.ToLower(o.hex), "0123456789abcdef") != "" {
			return "", errors.New("-scoped-key must be 64 hex characters")
		}
		return strings.ToLower(o.hex), nil
	}
	if o.key == "" || o.route == "" {
		return "", errors.New("-key and -route are required (or -scoped-key)")
	}
	key, err := idem.ParseKey([]string{o.key}) // "abc" (sf-string) and abc name the same key
	if err != nil {
		return "", fmt.Errorf("-key: %w", err)
	}
	return idem.ScopedKey(o.principal, strings.ToUpper(o.method), o.route, key), nil
}

// open returns the store named by o.store as an Inspector, and a function
// releasing its client.
func open(ctx context.Context, o cmdFlags) (idem.Inspector, func(), error) {
	u, err := url.Parse(o.store)
	if err != nil {
		return nil, nil, fmt.Errorf("-store: %w", err)
	}
	switch u.Scheme {
	case "redis", "rediss":
		opts, err := redis.ParseURL(o.store)
		if err != nil {
			return nil, nil, fmt.Errorf("-store: %w", err)
		}
		client := redis.NewClient(opts)
		return redisstore.New(client, redisstore.WithPrefix(o.prefix)), func() { _ = client.Close() }, nil
	case "mongodb", "mongodb+srv":
		db, coll, ok := strings.Cut(o.collection, ".")
		if !ok || db == "" || coll == "" {
			return nil, nil, fmt.Errorf("-collection %q: want database.collection", o.collection)
		}
		client, err := mongo.Connect(options.Client().ApplyURI(o.store))
		if err != nil {
			return nil, nil, fmt.Errorf("-store: %w", err)
		}
		s := mongostore.New(client.Database(db).Collection(coll))
		return s, func() {
			_ = s.Close()
			_ = client.Disconnect(context.WithoutCancel(ctx))
		}, nil
	case "mysql":
		cfg, err := mysqlConfig(u)
		if err != nil {
			return nil, nil, fmt.Errorf("-store: %w", err)
		}
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("-store: %w", err)
		}
		db := sql.OpenDB(conn)
		s := mysqlstore.New(db, mysqlstore.WithTable(o.table))
		return s, func() { _ = s.Close(); _ = db.Close() }, nil
	}
	return nil, nil, fmt.Errorf("-store %q: want a redis://, rediss://, mongodb://, mongodb+srv:// or mysql:// URL", o.store)
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

// printRecord writes the operator's view of a record: state, time to live
// (and the expiry it gives from now), lease owner, fingerprint, and for
// completed records the stored status, header lines (sorted by name) and
// body size, decoded from the record's response ([idem.DecodeResponse]).
func printRecord(w io.Writer, key string, info idem.RecordInfo, now time.Time) {
	fmt.Fprintf(w, "scoped key   %s\n", key)
	fmt.Fprintf(w, "state        %s\n", info.State)
	ttl := info.TTL.Round(time.Millisecond)
	if ttl >= time.Minute {
		ttl = ttl.Round(time.Second)
	}
	at := now.Add(info.TTL).UTC().Format(time.RFC3339)
	switch info.State {
	case idem.StateInProgress:
		fmt.Fprintf(w, "expires in   %v, at %s (lease: a handler that still runs renews it every lease/3)\n", ttl, at)
		fmt.Fprintf(w, "lease owner  %s\n", info.Token)
	case idem.StateCompleted:
		fmt.Fprintf(w, "expires in   %v, at %s (retention)\n", ttl, at)
	}
	fmt.Fprintf(w, "fingerprint  %s\n", info.Fingerprint)
	if info.Response == nil {
		return
	}
	r, err := idem.DecodeResponse(info.Response)
	if err != nil {
		fmt.Fprintf(w, "response     %d bytes that do not decode (%v)\n", len(info.Response), err)
		return
	}
	fmt.Fprintf(w, "status       %d\n", r.Status)
	names := make([]string, 0, len(r.Header))
	for name := range r.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, v := range r.Header[name] {
			fmt.Fprintf(w, "header       %s: %s\n", name, v)
		}
	}
	fmt.Fprintf(w, "body         %d bytes\n", len(r.Body))
}

// confirm asks the operator and reports whether the answer is y or yes.
func confirm(stdin io.Reader, stdout io.Writer, state idem.State) bool {
	what := "A retry with this key will execute the request again."
	if state == idem.StateInProgress {
		what = "Its handler must no longer be running: a retry with this key will execute the request again."
	}
	fmt.Fprintf(stdout, "Evict this %s record? %s [y/N] ", state, what)
	line, _ := bufio.NewReader(stdin).ReadString('\n')
	answer := strings.ToLower(strings.TrimSpace(line))
	return answer == "y" || answer == "yes"
}
