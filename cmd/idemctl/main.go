package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemui"
)

const usage = `usage: idemctl show|evict|list|release|complete|resolve-step -store ADDR [flags] [KEY]
       idemctl serve -store ADDR [-addr HOST:PORT] [-token TOKEN] (the console; serve -h)

show     prints the idempotency record of one key, with every step of its
         journal and its result decoded (-body: the stored response body,
         raw, on stdout; the record on stderr);
evict    deletes it after a confirmation, so that a retry executes again;
list     prints in-progress, uncertain and oldest records, -limit at a time
         (-cursor for the next page), and for in-progress ones whether the
         lease is held or has lapsed;
release  resolves an uncertain record (idem.WithUncertainAfterCrash: its
         holder crashed mid-request) when the operation did NOT take effect:
         deletes it after a confirmation, so that the next retry executes;
complete resolves an uncertain record when the operation DID take effect:
         stores the answer retries get, -status with -file (the body, "-" for
         stdin) and -header lines, for -retention;
resolve-step settles one step whose outcome is unknown (its holder stopped
         inside a step that is not repeatable) after a confirmation, so that
         the next retry (or a recoverer) resumes the handler after it: with
         -result FILE the step DID happen and FILE ("-": stdin) holds its
         result as the step's codec encodes it (JSON by default); with
         -not-done it did NOT happen and runs when the handler resumes.

KEY (or -scoped-key) is the scoped key in any form idem prints: the 64 hex
characters of a trace's idem.scoped_key, or a prefix of them, such as the 16
of a log line's key= (pasted as is, "key=" included, if you like). Or name the
request: -principal, -method, -route and -key. With list, KEY keeps the
records whose scoped key starts with it.

Flags:
`

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // no record, an ambiguous prefix, not evicted, or a store error
	exitUsage = 2
)

// minPrefix is the shortest scoped-key prefix show and evict accept.
const minPrefix = 8

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

type cmdFlags struct {
	store, prefix, collection, table   string
	principal, method, route, key, hex string
	state, cursor                      string
	limit                              int
	yes, body                          bool
	timeout                            time.Duration
	lease                              leaseView     // show, list: the service's lease and store timeout
	status                             int           // complete
	file                               string        // complete
	headers                            headerLines   // complete
	retention                          time.Duration // complete
	step, result                       string        // resolve-step
	notDone                            bool          // resolve-step
}

// headerLines is complete's repeatable -header flag.
type headerLines []string

func (h *headerLines) String() string { return strings.Join(*h, ", ") }

func (h *headerLines) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" || strings.ContainsAny(name, " \t") {
		return fmt.Errorf("%q: want \"Name: value\"", v)
	}
	*h = append(*h, strings.TrimSpace(name)+": "+strings.TrimSpace(value))
	return nil
}

// run is the whole command: args without the program name; it returns the
// exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "serve" {
		return serve(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	var o cmdFlags
	storeFlags(fs, &o)
	fs.StringVar(&o.principal, "principal", "", "principal the adapter's scope function returned (empty with idem.WithGlobalScope)")
	fs.StringVar(&o.method, "method", "POST", `HTTP method (upper-cased), or "(do)" for an idem.Do or consumer record (taken as given)`)
	fs.StringVar(&o.route, "route", "", "route template as the adapter reports it, e.g. /v1/payments/:id (the request path if it reports none)")
	fs.StringVar(&o.key, "key", "", "Idempotency-Key header value as the client sent it")
	fs.StringVar(&o.hex, "scoped-key", "", "scoped key, 64 hex characters or a prefix of them (a log line's key=), instead of -principal, -method, -route and -key")
	fs.BoolVar(&o.yes, "yes", false, "evict without asking for confirmation")
	fs.BoolVar(&o.body, "body", false, "show: write the stored response body, raw, to stdout, and the record to stderr")
	fs.StringVar(&o.state, "state", "all", "list: in-progress, uncertain, completed or all")
	fs.IntVar(&o.limit, "limit", 20, "list: records per page")
	fs.StringVar(&o.cursor, "cursor", "", "list: the cursor the previous page printed")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "bound on the whole command")
	fs.DurationVar(&o.lease.lease, "lease", idem.DefaultLease, "show, list: the service's lease (idem.WithLease), to tell a holder that renews from one that stopped")
	fs.DurationVar(&o.lease.storeTimeout, "store-timeout", idem.DefaultStoreTimeout, "show, list: the service's store timeout (idem.WithStoreTimeout), the renewal's margin")
	fs.IntVar(&o.status, "status", 0, "complete: the HTTP status retries get (100-599)")
	fs.StringVar(&o.file, "file", "", `complete: file holding the body retries get ("-": stdin; none: empty body)`)
	fs.Var(&o.headers, "header", `complete: a header line retries get, "Name: value" (repeatable)`)
	fs.DurationVar(&o.retention, "retention", idem.DefaultRetention, "complete: how long retries get the answer (the service's WithRetention)")
	fs.StringVar(&o.step, "step", "", "resolve-step: the step's name, as given to idem.Step")
	fs.StringVar(&o.result, "result", "", `resolve-step: file holding the result of a step that happened, as its codec encodes it (JSON by default; "-": stdin)`)
	fs.BoolVar(&o.notDone, "not-done", false, "resolve-step: the step did not happen: it runs when the handler resumes")
	if len(args) == 0 || !slices.Contains([]string{"show", "evict", "list", "release", "complete", "resolve-step"}, args[0]) {
		fs.Usage()
		return exitUsage
	}
	cmd := args[0]
	if err := parse(fs, args[1:], &o); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "idemctl:", err)
		}
		return exitUsage
	}
	var (
		key   string // full scoped key, or "" when prefix names it
		query idem.ListQuery
		err   error
	)
	if cmd == "list" {
		query, err = o.listQuery()
	} else {
		key, query.KeyPrefix, err = o.scopedKey()
	}
	if err == nil && o.store == "" {
		err = errors.New("-store is required")
	}
	if err == nil && (o.lease.lease <= 0 || o.lease.storeTimeout <= 0) {
		err = errors.New("-lease and -store-timeout must be > 0")
	}
	var answer []byte // complete's encoded response, resolve-step's result
	switch {
	case err != nil:
	case cmd == "complete":
		answer, err = o.answer(stdin)
	case cmd == "resolve-step":
		answer, err = o.stepResult(stdin)
	}
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	b, err := open(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		return exitUsage
	}
	defer b.close()

	if cmd == "list" {
		return list(ctx, b, query, o.lease, stdout, stderr)
	}
	listed := key == "" // the store listed the key: it holds a record, maybe a lapsed lease
	if listed {
		var code int
		if key, code = resolve(ctx, b, query.KeyPrefix, o.lease, stdout, stderr); key == "" {
			return code
		}
	}
	info, found, err := b.in.Inspect(ctx, key)
	if err != nil {
		fmt.Fprintf(stderr, "idemctl: inspect %s: %v\n", b.layout, err)
		printHints(ctx, b, stderr)
		return exitFail
	}
	if cmd == "resolve-step" {
		return resolveStep(ctx, b, key, info, found, answer, o, stdin, stdout, stderr)
	}
	if !found {
		fmt.Fprintf(stdout, "scoped key   %s\nstore key    %s\nno live record: the key is absent or expired (a request with it executes)\n", key, b.storeKey(key))
		if listed {
			fmt.Fprintln(stdout, "the store still keeps it: an in-progress record whose lease lapsed (its holder stopped renewing), until it is purged or taken over")
		} else {
			notFound(ctx, b, stderr)
		}
		return exitFail
	}
	view := stdout
	if o.body {
		view = stderr
	}
	fmt.Fprintf(view, "scoped key   %s\nstore key    %s\n", key, b.storeKey(key))
	printRecord(view, info, o.lease, time.Now())
	if j, ok := b.in.(idem.Journal); ok {
		steps, err := j.Steps(ctx, key)
		if err != nil {
			fmt.Fprintf(stderr, "idemctl: steps: %v\n", err)
			return exitFail
		}
		printSteps(view, steps)
		printNext(view, info, steps)
	} else {
		printNext(view, info, nil)
	}
	switch {
	case cmd == "show" && o.body:
		return dumpBody(info, stdout, stderr)
	case cmd == "show":
		return exitOK
	case cmd == "release" || cmd == "complete":
		return resolveUncertain(ctx, b, cmd, key, info, answer, o, stdin, stdout, stderr)
	}
	if !o.yes && !confirm(stdin, stdout, info.State) {
		fmt.Fprintln(stdout, "not evicted")
		return exitFail
	}
	switch err := b.in.Evict(ctx, key, info.Record); {
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

// parse parses args into o, taking one positional KEY (-scoped-key)
// wherever it stands among the flags.
func parse(fs *flag.FlagSet, args []string, o *cmdFlags) error {
	var keys []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		keys = append(keys, fs.Arg(0))
		args = fs.Args()[1:]
	}
	switch {
	case len(keys) > 1:
		return fmt.Errorf("unexpected arguments %q: one KEY at most", keys)
	case len(keys) == 1 && o.hex != "":
		return errors.New("KEY and -scoped-key both given")
	case len(keys) == 1:
		o.hex = keys[0]
	}
	return nil
}

// hexKey returns -scoped-key (or KEY) as lowercase hex, with a pasted
// "key=" dropped, and whether it was given.
func (o *cmdFlags) hexKey() (string, bool, error) {
	if o.hex == "" {
		return "", false, nil
	}
	h := strings.ToLower(strings.TrimPrefix(o.hex, "key="))
	if len(h) > 64 || strings.Trim(h, "0123456789abcdef") != "" {
		return "", true, errors.New("the scoped key must be 64 hex characters or a prefix of them (a log line's key=)")
	}
	return h, true, nil
}

// scopedKey returns the key show and evict read: a full scoped key, or a
// prefix of one to look up (the other result empty). The full key is
// -scoped-key, or the one the engine computes from the scope and the
// idempotency key (idem.ScopedKey).
func (o *cmdFlags) scopedKey() (key, prefix string, err error) {
	h, given, err := o.hexKey()
	switch {
	case err != nil:
		return "", "", err
	case given && o.key != "":
		return "", "", errors.New("give a scoped key or -key, not both")
	case given && len(h) == 64:
		return h, "", nil
	case given && len(h) < minPrefix:
		return "", "", fmt.Errorf("a scoped-key prefix needs at least %d hex characters (log lines carry 16)", minPrefix)
	case given:
		return "", h, nil
	}
	if o.key == "" || o.route == "" {
		return "", "", errors.New("-key and -route are required (or a scoped key)")
	}
	k, err := idem.ParseKey([]string{o.key}) // "abc" (sf-string) and abc name the same key
	if err != nil {
		return "", "", fmt.Errorf("-key: %w", err)
	}
	return idem.ScopedKey(o.principal, recordMethod(o.method), o.route, k), "", nil
}

// recordMethod returns -method as the engine records it: an HTTP method
// upper-cased (post names POST); "(do)", the method of idem.Do and
// consumer records, which is no HTTP method token, as given.
func recordMethod(m string) string {
	if strings.HasPrefix(m, "(") {
		return m
	}
	return strings.ToUpper(m)
}

// listQuery returns list's query: its state, -limit, -cursor and the key
// prefix (a request's full key when -key is given).
func (o *cmdFlags) listQuery() (idem.ListQuery, error) {
	q := idem.ListQuery{Limit: o.limit, Cursor: o.cursor}
	switch o.state {
	case "in-progress":
		q.State = idem.StateInProgress
	case "completed":
		q.State = idem.StateCompleted
	case "uncertain":
		q.State = idem.StateUncertain
	case "all":
	default:
		return q, fmt.Errorf("-state %q: want in-progress, uncertain, completed or all", o.state)
	}
	if o.limit <= 0 {
		return q, errors.New("-limit must be > 0")
	}
	if o.key != "" || o.hex != "" {
		key, prefix, err := o.scopedKey()
		if err != nil {
			return q, err
		}
		q.KeyPrefix = key + prefix
	}
	return q, nil
}

// maxMatches is how many records a prefix lookup lists when the prefix is
// ambiguous.
const maxMatches = 10

// resolve looks up the one record whose scoped key starts with prefix. It
// returns "" and the exit code when there is none or more than one (then
// listed).
func resolve(ctx context.Context, b *backend, prefix string, lv leaseView, stdout, stderr io.Writer) (string, int) {
	if b.ls == nil {
		fmt.Fprintf(stderr, "idemctl: %s cannot look a key prefix up; give the 64-hex scoped key or the request\n", b.layout)
		return "", exitUsage
	}
	var found []idem.ListedRecord
	q := idem.ListQuery{KeyPrefix: prefix, Limit: maxMatches}
	for {
		page, err := b.ls.List(ctx, q)
		if err != nil {
			fmt.Fprintf(stderr, "idemctl: look the key prefix up in %s: %v\n", b.layout, err)
			printHints(ctx, b, stderr)
			return "", exitFail
		}
		for _, r := range page.Records { // Redis SCAN may return a key twice
			if !slices.ContainsFunc(found, func(f idem.ListedRecord) bool { return f.Key == r.Key }) {
				found = append(found, r)
			}
		}
		if page.Next == "" || len(found) > 1 {
			break
		}
		q.Cursor = page.Next
	}
	switch len(found) {
	case 0:
		fmt.Fprintf(stdout, "key prefix   %s\nno record's scoped key starts with it\n", prefix)
		notFound(ctx, b, stderr)
		return "", exitFail
	case 1:
		return found[0].Key, exitOK
	}
	fmt.Fprintf(stdout, "key prefix   %s is ambiguous; give more of the scoped key. Records found:\n", prefix)
	printList(stdout, found[:min(len(found), maxMatches)], lv)
	return "", exitFail
}

// list prints one page of records and how to ask for the next.
func list(ctx context.Context, b *backend, q idem.ListQuery, lv leaseView, stdout, stderr io.Writer) int {
	if b.ls == nil {
		fmt.Fprintf(stderr, "idemctl: %s cannot list records\n", b.layout)
		return exitUsage
	}
	page, err := b.ls.List(ctx, q)
	if err != nil {
		fmt.Fprintf(stderr, "idemctl: list %s: %v\n", b.layout, err)
		printHints(ctx, b, stderr)
		return exitFail
	}
	// Soonest expiry first: stuck leases, then the oldest records (SQL and
	// MongoDB pages come so; Redis pages in scan order).
	slices.SortStableFunc(page.Records, func(a, b idem.ListedRecord) int { return cmp.Compare(a.TTL, b.TTL) })
	fmt.Fprintf(stdout, "store        %s\n", b.layout)
	switch {
	case len(page.Records) == 0 && page.Next != "":
		fmt.Fprintln(stdout, "none in this part of the store")
	case len(page.Records) == 0 && q.Cursor == "":
		msg := "no records"
		if h := b.hints(ctx); len(h) > 0 {
			msg += ": " + strings.Join(h, "; ")
		}
		fmt.Fprintln(stdout, msg)
	}
	printList(stdout, page.Records, lv)
	if page.Next != "" {
		fmt.Fprintf(stdout, "more: run again with -cursor %s\n", page.Next)
	}
	return exitOK
}

// printList writes one line per record: scoped key, state, the time left
// on its lease (and whether its holder renews it, or it lapsed), its keep
// (uncertain) or its retention, and the lease owner. The route is not
// shown: stores keep only the hashed scoped key (idem.ScopedKey).
func printList(w io.Writer, recs []idem.ListedRecord, lv leaseView) {
	for _, r := range recs {
		ttl := roundTTL(r.TTL)
		switch {
		case r.State == idem.StateUncertain:
			fmt.Fprintf(w, "%s  uncertain    holder stopped mid-request, or a step's outcome is unknown: retries get 409 until resolved (idemctl show KEY lists the steps: resolve-step for a step started and not done, else release or complete; %s), kept %v more, owner %s\n", r.Key, runbook("uncertain-payment"), ttl, owner(r.Token))
		case r.State == idem.StateInProgress && r.TTL > 0 && lv.renewing(r.TTL):
			fmt.Fprintf(w, "%s  in-progress  lease held, %v left, renewed or new (above %v): retries get 409, owner %s\n", r.Key, ttl, lv.floor(), owner(r.Token))
		case r.State == idem.StateInProgress && r.TTL > 0:
			fmt.Fprintf(w, "%s  in-progress  lease held, %v left, NOT renewed (at most %v: its holder stopped): retries get 409 until it lapses, owner %s\n", r.Key, ttl, lv.floor(), owner(r.Token))
		case r.State == idem.StateInProgress:
			fmt.Fprintf(w, "%s  in-progress  lease lapsed %v ago, due: its holder stopped renewing it (or an operator resolved a step); the next request with its key, or a recoverer, takes it over and resumes from its journal, owner %s\n", r.Key, -ttl, owner(r.Token))
		default:
			fmt.Fprintf(w, "%s  %s    expires in %v\n", r.Key, r.State, ttl)
		}
	}
}

// leaseView is what tells a holder that renews its lease from one that
// stopped: the service's lease and store timeout (-lease, -store-timeout).
type leaseView struct{ lease, storeTimeout time.Duration }

// floor is the least time a renewing holder's lease has left: the engine
// writes a full lease every lease/3, and a renewal's round trip and the
// read's take up to a store timeout each (the rule of the engine's 409
// Retry-After, core/engine.go conflictRetryAfter).
func (lv leaseView) floor() time.Duration { return lv.lease - lv.lease/3 - 2*lv.storeTimeout }

// renewing reports whether an in-progress record's lease, with left on it,
// is above the floor: its holder renews it, or took it less than
// lease - left ago.
func (lv leaseView) renewing(left time.Duration) bool { return left > lv.floor() }

// holder says whether the holder of an in-progress lease with left on it
// still renews it.
func (lv leaseView) holder(left time.Duration) string {
	switch {
	case left <= 0:
		return fmt.Sprintf("none: the lease lapsed %v ago (its holder stopped renewing it, or an operator resolved a step with idemctl resolve-step); due: the next request with this key, or a recoverer, takes it over and resumes the handler from its journal", roundTTL(-left))
	case left > lv.lease+lv.storeTimeout:
		// A store's clock (mongostore's estimate of its server's, to half a
		// round trip) may put a just-taken lease a little above -lease; a
		// round trip is at most a store timeout.
		return fmt.Sprintf("%v left is more than -lease %v: pass the service's lease (idem.WithLease) as -lease to tell whether its holder renews", roundTTL(left), lv.lease)
	case lv.floor() <= 0:
		return fmt.Sprintf("unknown: -lease %v is too short beside -store-timeout %v to tell", lv.lease, lv.storeTimeout)
	case lv.renewing(left):
		return fmt.Sprintf("renews it, or took it less than %v ago: %v left is above %v, the least a renewing holder keeps (-lease %v - lease/3 - 2 × -store-timeout %v); show again after %v to tell",
			roundTTL(max(0, lv.lease-left)), roundTTL(left), lv.floor(), lv.lease, lv.storeTimeout, roundTTL(left-lv.floor()))
	}
	return fmt.Sprintf("stopped renewing (crashed, or its process stalls): %v left is at most %v, the least a renewing holder keeps (-lease %v - lease/3 - 2 × -store-timeout %v); the lease lapses in %v, then the next request executes",
		roundTTL(left), lv.floor(), lv.lease, lv.storeTimeout, roundTTL(left))
}

// owner names the host and process id that hold a lease, read from its
// token ([idem.TokenOwner]), and the token itself.
func owner(token string) string {
	if token == "" {
		return "unknown (no token stored)"
	}
	if host, pid, ok := idem.TokenOwner(token); ok {
		return fmt.Sprintf("host %s, pid %d (token %s)", host, pid, token)
	}
	return token + " (names no host and process: not an engine's host:pid:random.counter token)"
}

// notFound says on stderr where nothing was found and what idemctl
// checked there (backend.hints): only what is true.
func notFound(ctx context.Context, b *backend, stderr io.Writer) {
	fmt.Fprintf(stderr, "idemctl: nothing found in %s\n", b.layout)
	printHints(ctx, b, stderr)
}

// printHints writes what idemctl checked is true of the layout
// (backend.hints) on stderr, one line each.
func printHints(ctx context.Context, b *backend, stderr io.Writer) {
	for _, h := range b.hints(ctx) {
		fmt.Fprintf(stderr, "idemctl: %s\n", h)
	}
}

// roundTTL rounds a time to live for display.
func roundTTL(d time.Duration) time.Duration {
	d = d.Round(time.Millisecond)
	if d >= time.Minute || d <= -time.Minute {
		d = d.Round(time.Second)
	}
	return d
}

// dumpBody writes a completed record's stored response body, byte for
// byte, to stdout.
func dumpBody(info idem.RecordInfo, stdout, stderr io.Writer) int {
	if info.State != idem.StateCompleted {
		fmt.Fprintf(stderr, "idemctl: no body: the record is %s\n", info.State)
		return exitFail
	}
	r, err := idem.DecodeResponse(info.Response)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl: the stored response does not decode:", err)
		return exitFail
	}
	if _, err := stdout.Write(r.Body); err != nil {
		fmt.Fprintln(stderr, "idemctl: write the body:", err)
		return exitFail
	}
	return exitOK
}

// printRecord writes the operator's view of a record: state, time to live
// (and the expiry it gives from now), lease owner, fingerprint, and for
// completed records the stored status, header lines (sorted by name) and
// body (its size and its first bytes), decoded from the record's response
// ([idem.DecodeResponse]).
func printRecord(w io.Writer, info idem.RecordInfo, lv leaseView, now time.Time) {
	fmt.Fprintf(w, "state        %s\n", info.State)
	ttl := roundTTL(info.TTL)
	at := now.Add(info.TTL).UTC().Format(time.RFC3339)
	switch {
	case info.State == idem.StateInProgress && info.TTL <= 0:
		fmt.Fprintf(w, "lease        lapsed %v ago, at %s: due (taken over by the next request with this key or a recoverer)\n", -ttl, at)
		fmt.Fprintf(w, "last owner   %s\n", owner(info.Token))
		fmt.Fprintf(w, "holder       %s\n", lv.holder(info.TTL))
	case info.State == idem.StateInProgress:
		fmt.Fprintf(w, "expires in   %v, at %s (lease: a handler that still runs renews it every lease/3)\n", ttl, at)
		fmt.Fprintf(w, "lease owner  %s\n", owner(info.Token))
		fmt.Fprintf(w, "holder       %s\n", lv.holder(info.TTL))
	case info.State == idem.StateCompleted:
		fmt.Fprintf(w, "expires in   %v, at %s (retention)\n", ttl, at)
	case info.State == idem.StateUncertain:
		fmt.Fprintf(w, "expires in   %v, at %s (uncertain: its holder stopped mid-request, or a step's outcome is unknown (see the steps below); retries get 409 operation-uncertain until it is resolved: see next)\n", ttl, at)
		fmt.Fprintf(w, "lease owner  %s\n", owner(info.Token))
	case info.State == idem.StateExpired:
		fmt.Fprintf(w, "expires in   %v, at %s (tombstone: the response is gone; retries get 410 key-expired)\n", ttl, at)
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
	if len(r.Body) == 0 {
		fmt.Fprintln(w, "body         0 bytes")
		return
	}
	fmt.Fprintf(w, "body         %d bytes: %s\n", len(r.Body), shown(r.Body, maxShownBody))
}

// printSteps prints the record's step journal ([idem.Step]), one line a
// step in the order they started: done, with its result decoded
// ([idem.DecodeStep]: the value as its codec encoded it, JSON by default,
// or its permanent error), or started and not done, by its starter.
func printSteps(w io.Writer, steps []idem.StepEntry) {
	for _, st := range steps {
		if !st.Done {
			fmt.Fprintf(w, "step         %s: started, not done: its outcome is unknown if its holder stopped (started by %s)\n", st.Name, owner(st.Token))
			continue
		}
		out, err := idem.DecodeStep(st)
		switch {
		case err != nil:
			fmt.Fprintf(w, "step         %s: done, result %d bytes that do not decode (%v) (started by %s)\n", st.Name, len(st.Result), err, owner(st.Token))
		case out.Err != nil:
			fmt.Fprintf(w, "step         %s: done, permanent error %q (started by %s)\n", st.Name, out.Err.Message, owner(st.Token))
		default:
			fmt.Fprintf(w, "step         %s: done, result %s (started by %s)\n", st.Name, shown(out.Value, maxShownStep), owner(st.Token))
		}
	}
}

// confirm asks the operator and reports whether the answer is y or yes.
func confirm(stdin io.Reader, stdout io.Writer, state idem.State) bool {
	fmt.Fprintf(stdout, "%s %s [y/N] ", idemui.EvictQuestion(state), idemui.EvictSteps)
	line, _ := bufio.NewReader(stdin).ReadString('\n')
	answer := strings.ToLower(strings.TrimSpace(line))
	return answer == "y" || answer == "yes"
}

// answer returns complete's response, encoded as the engine stores it:
// -status, -header lines and the body read from -file.
func (o *cmdFlags) answer(stdin io.Reader) ([]byte, error) {
	if o.status < 100 || o.status > 599 {
		return nil, errors.New("complete needs -status, 100 to 599")
	}
	if o.retention <= 0 {
		return nil, errors.New("-retention must be > 0")
	}
	r := &idem.Response{Status: o.status, Header: http.Header{}}
	for _, line := range o.headers {
		name, value, _ := strings.Cut(line, ": ")
		r.Header.Add(name, value)
	}
	var err error
	switch o.file {
	case "":
	case "-":
		r.Body, err = io.ReadAll(stdin)
	default:
		r.Body, err = os.ReadFile(o.file)
	}
	if err != nil {
		return nil, fmt.Errorf("-file: %w", err)
	}
	return idem.EncodeResponse(r), nil
}

// resolveUncertain runs release and complete on the uncertain record info
// of key: after a confirmation (release), one atomic [idem.Keeper.Resolve].
func resolveUncertain(ctx context.Context, b *backend, cmd, key string, info idem.RecordInfo, answer []byte, o cmdFlags, stdin io.Reader, stdout, stderr io.Writer) int {
	if b.kp == nil {
		fmt.Fprintf(stderr, "idemctl: %s keeps no uncertain records\n", b.layout)
		return exitUsage
	}
	if info.State != idem.StateUncertain {
		fmt.Fprintf(stdout, "not resolved: the record is %s, not uncertain (evict deletes any record)\n", info.State)
		return exitFail
	}
	if cmd == "release" && !o.yes {
		fmt.Fprintf(stdout, "%s %s [y/N] ", idemui.ReleaseQuestion, idemui.ReleaseSteps)
		line, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			fmt.Fprintln(stdout, "not released")
			return exitFail
		}
	}
	switch err := b.kp.Resolve(ctx, key, answer, o.retention); {
	case errors.Is(err, idem.ErrRecordChanged):
		fmt.Fprintln(stdout, "not resolved: the record changed since it was shown (its holder completed or released it, or it expired); run idemctl show again")
		return exitFail
	case err != nil:
		fmt.Fprintf(stderr, "idemctl: %s: %v\n", cmd, err)
		return exitFail
	}
	if cmd == "release" {
		fmt.Fprintln(stdout, "released: the next request with this key executes")
	} else {
		fmt.Fprintf(stdout, "completed: retries get %d for %v\n", o.status, o.retention)
	}
	return exitOK
}

// runbookURL is the operator's runbook (docs/runbook.md); its sections
// say what each case means, what to check, which command and what never
// to do.
const runbookURL = "https://github.com/idemkit/idem/blob/main/docs/runbook.md"

// runbook returns the address of the runbook's section anchor.
func runbook(anchor string) string { return "runbook: " + runbookURL + "#" + anchor }

// printNext writes what resolves an uncertain record, given its steps: a
// step started and not done is settled with resolve-step (release would
// delete the journal, so every step, that one included, would run again);
// else release or complete.
func printNext(w io.Writer, info idem.RecordInfo, steps []idem.StepEntry) {
	if info.State != idem.StateUncertain {
		return
	}
	var open []string
	for _, st := range steps {
		if !st.Done {
			open = append(open, st.Name)
		}
	}
	if len(open) == 0 {
		fmt.Fprintf(w, "next         check whether the operation took effect: if not, idemctl release (the next retry executes it); if it did, idemctl complete -status ... -file ... (retries get that answer); %s\n", runbook("uncertain-payment"))
		return
	}
	for _, name := range open {
		fmt.Fprintf(w, "next         step %s started and its outcome is unknown: check whether its effect happened, then idemctl resolve-step -step %s -result FILE (it happened: FILE holds its result) or -not-done (it did not); the handler resumes after it. Not release: it deletes the journal, so the retry runs every step again, %s included; %s\n", name, name, name, runbook("uncertain-payment"))
	}
}
