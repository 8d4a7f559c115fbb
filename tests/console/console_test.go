package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemui"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

var screenshots = flag.String("screenshots", "", "directory to save PNG screenshots of the console's pages in (docs/console)")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// chromium is the browser the tests drive: $IDEM_CHROMIUM, else Debian's
// package (scripts/services.sh installs it).
var chromium = cmpOr(os.Getenv("IDEM_CHROMIUM"), "/usr/bin/chromium")

func randomHex(n int) string {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func redisStore(t *testing.T) idem.Store {
	u := cmpOr(os.Getenv("IDEM_REDIS_URL"), "redis://127.0.0.1:6379/0")
	opts, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	prefix := "idemui-e2e:" + randomHex(16) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
		_ = client.Close()
	})
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Redis at %s (IDEM_REDIS_URL): %v", u, err)
	}
	return redisstore.New(client, redisstore.WithPrefix(prefix))
}

func postgresStore(t *testing.T) idem.Store {
	u := cmpOr(os.Getenv("IDEM_POSTGRES_URL"), "postgres://postgres@127.0.0.1:5432/test")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	table := "idemui_e2e_" + randomHex(12)
	s := pgstore.New(pool, pgstore.WithTable(table))
	t.Cleanup(func() {
		_ = s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+table)
		pool.Close()
	})
	if err := s.EnsureSchema(ctx); err != nil {
		t.Fatalf("PostgreSQL at %s (IDEM_POSTGRES_URL): %v", u, err)
	}
	return s
}

// crashable returns store without its lease renewal (idem.Extender): an
// execution held in its handler past its lease looks crashed, and a
// recoverer or a retry takes it over. Its journal, keep, recovery and step
// resolution stay.
func crashable(store idem.Store) idem.Store {
	return struct {
		idem.Store
		idem.Keeper
		idem.Journal
		idem.Recoverable
		idem.StepResolver
	}{store, store.(idem.Keeper), store.(idem.Journal), store.(idem.Recoverable), store.(idem.StepResolver)}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// browser starts a headless Chromium for the test, with a fresh profile,
// and returns its context; it is stopped at the test's end.
func browser(t *testing.T) context.Context {
	t.Helper()
	if _, err := exec.LookPath(chromium); err != nil {
		t.Fatalf("%s: %v (scripts/services.sh installs Debian's chromium package; IDEM_CHROMIUM names another)", chromium, err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("hide-scrollbars", true), chromedp.Flag("mute-audio", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 860),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start %s: %v", chromium, err)
	}
	return ctx
}

// TestConsoleSettlesACrashedPayment is the operator's story in a real
// browser on Redis and PostgreSQL: a payment's process dies inside its mail
// step (after the charge step); the operator logs in and the console shows
// its record with the lease lapsed, due for recovery; the recoverer takes
// it over and its run ends uncertain (the mail's outcome is unknown); the
// operator opens the record, sees the charge's result, marks the mail step
// done with the provider's answer on the confirmation page; the recoverer
// resumes the handler after the mail step (neither step runs again, the
// ledger row is written once), the client's retry gets the answer, and the
// console shows the record completed with the operator's audit entry.
func TestConsoleSettlesACrashedPayment(t *testing.T) {
	bctx := browser(t)
	for _, tc := range []struct {
		name  string
		store func(*testing.T) idem.Store
	}{{"redis", redisStore}, {"postgres", postgresStore}} {
		t.Run(tc.name, func(t *testing.T) {
			shots := ""
			if *screenshots != "" && tc.name == "redis" {
				shots = *screenshots
			}
			testConsole(t, bctx, tc.store(t), shots)
		})
	}
}

func testConsole(t *testing.T, bctx context.Context, store idem.Store, shots string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const lease, storeTimeout = 2 * time.Second, 500 * time.Millisecond
	// The engine's holders stop renewing their leases, as a crashed process's.
	engine, err := idem.New(crashable(store), idem.WithLease(lease), idem.WithStoreTimeout(storeTimeout),
		idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = engine.Close(ctx) }()

	token := "e2e-" + randomHex(32)
	audit := idemui.NewAuditLog(100)
	mux := http.NewServeMux()
	mux.Handle("/admin/idem/", http.StripPrefix("/admin/idem", idemui.Handler(store,
		idemui.WithToken(token), idemui.WithWrites(nil), idemui.WithLease(lease, storeTimeout), idemui.WithAudit(audit),
		idemui.WithLogger(slog.New(slog.DiscardHandler)))))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	console := srv.URL + "/admin/idem"

	type receipt struct {
		ID string `json:"id"`
	}
	var charges, mails, ledger atomic.Int64
	crash := make(chan struct{}) // holds the first mail step: its process died there
	pay := func(ctx context.Context) (string, error) {
		charge, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
			return fmt.Sprintf("ch_%d", charges.Add(1)), nil
		}, idem.Repeatable())
		if err != nil {
			return "", err
		}
		mail, err := idem.Step(ctx, "mail", func(context.Context) (receipt, error) {
			n := mails.Add(1)
			if n == 1 {
				<-crash
			}
			return receipt{ID: fmt.Sprintf("mail_%d", n)}, nil
		})
		if err != nil {
			return "", err
		}
		ledger.Add(1)
		return charge + "/" + mail.ID, nil
	}
	op := idem.Operation{Scope: "acct_1", Name: "pay", Key: "pay-" + randomHex(8), Payload: []byte(`{"amount":1200}`), Recover: true}
	recoverer, err := idem.NewRecoverer(engine)
	if err != nil {
		t.Fatal(err)
	}
	recoverer.Handle("pay", func(ctx context.Context, op idem.Operation) error {
		_, err := idem.Do(ctx, engine, op, pay)
		return err
	})
	// recoverUntil runs recovery passes until one reports what done wants.
	recoverUntil := func(what string, done func(idem.RecoveryReport) bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			rep, err := recoverer.RecoverOnce(ctx)
			if err != nil {
				t.Fatalf("recovery pass: %v", err)
			}
			if done(rep) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no recovery pass %s: the last reported %+v", what, rep)
			}
		}
	}
	key := op.RecordKey()

	// Neighbours, for a listing that looks like a store's: a holder that
	// renews, and a payment completed earlier.
	if _, ok, err := store.Acquire(ctx, randomHex(64), "api-7:3101:Q2W3E4R5T6Y7U8I9.4", "fp", time.Hour); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	doneKey, doneToken := randomHex(64), "api-7:3101:Q2W3E4R5T6Y7U8I9.5"
	if _, ok, err := store.Acquire(ctx, doneKey, doneToken, "fp", time.Hour); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if err := store.Complete(ctx, doneKey, doneToken, idem.EncodeResponse(&idem.Response{Status: 201, Body: []byte(`{"id":"pay_0"}`)}), time.Hour); err != nil {
		t.Fatal(err)
	}

	crashed := make(chan struct{})
	go func() { defer close(crashed); _, _ = idem.Do(ctx, engine, op, pay) }() // its completion is fenced off
	defer func() { close(crash); <-crashed }()
	for deadline := time.Now().Add(time.Minute); mails.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first run never reached its mail step")
		}
	}
	// Its lease lapses: the store lists the record with no time left.
	ls := store.(idem.Lister)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		page, err := ls.List(ctx, idem.ListQuery{KeyPrefix: key, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Records) == 1 && page.Records[0].TTL <= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the crashed holder's lease never lapsed: %+v", page)
		}
	}

	tab, closeTab := chromedp.NewContext(bctx)
	defer closeTab()
	tab, cancelTab := context.WithTimeout(tab, 2*time.Minute)
	defer cancelTab()
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(tab, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(tab, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return s
	}
	shot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	row := fmt.Sprintf(`a[href="/admin/idem/record/%s"]`, key)

	// The operator logs in: every page needs the token.
	run("log in", chromedp.Navigate(console+"/"), chromedp.WaitVisible(chromedp.ID("login")),
		chromedp.SendKeys(chromedp.ID("operator"), "alice"), chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("login")), chromedp.WaitVisible(chromedp.CSS(`table.records, p.empty`)))

	// The console shows the record with its lease lapsed.
	run("lapsed tab", chromedp.Navigate(console+"/?state=lapsed"), chromedp.WaitVisible(chromedp.CSS(row)))
	if s := text(`table.records`); !strings.Contains(s, "lease lapsed") || !strings.Contains(s, "lapsed ") {
		t.Fatalf("lapsed tab:\n%s", s)
	}
	run("all tab", chromedp.Navigate(console+"/?state=all"), chromedp.WaitVisible(chromedp.CSS(row)))
	shot("records.png")
	run("due tab", chromedp.Navigate(console+"/?state=due"), chromedp.WaitVisible(chromedp.CSS(row)))
	if s := text(`table.records`); !strings.Contains(s, "due for recovery") {
		t.Fatalf("due tab:\n%s", s)
	}
	shot("due.png")

	// The recoverer takes the record over; the mail step's outcome is
	// unknown, so its run ends uncertain.
	recoverUntil("ending uncertain", func(r idem.RecoveryReport) bool { return r.Uncertain == 1 })
	if _, err := idem.Do(ctx, engine, op, pay); !errors.Is(err, idem.ErrUncertain) {
		t.Fatalf("the client's retry of the uncertain record: %v; want ErrUncertain", err)
	}

	// The operator finds it uncertain, opens it and settles the mail step.
	run("uncertain tab", chromedp.Navigate(console+"/?state=uncertain"), chromedp.WaitVisible(chromedp.CSS(row)))
	shot("uncertain.png")
	run("open the record", chromedp.Click(chromedp.CSS(row)), chromedp.WaitVisible(chromedp.CSS(`table.steps`)))
	if s := text(`table.steps`); !strings.Contains(s, `"ch_1"`) || !strings.Contains(s, "started, not done") {
		t.Fatalf("steps:\n%s", s)
	}
	if s := text(`table.facts`); !strings.Contains(s, "uncertain") {
		t.Fatalf("record:\n%s", s)
	}
	shot("record-uncertain.png")
	run("resolve the mail step", chromedp.Click(chromedp.CSS(`a[href*="step=mail&done=1"]`)), chromedp.WaitVisible(chromedp.ID("result")))
	if s := text(`div.question`); !strings.Contains(s, idemui.ResolveStepQuestion("mail", true, "the result below")) || !strings.Contains(s, idemui.ResolveStepSteps) {
		t.Fatalf("confirmation:\n%s", s)
	}
	run("fill the result", chromedp.SendKeys(chromedp.ID("result"), `{"id":"mail_provider_42"}`))
	shot("confirm-resolve-step.png")
	run("confirm", chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.CSS(`p.done`)))
	if s := text(`p.done`); !strings.Contains(s, "resolved: the next retry") {
		t.Fatalf("after the confirmation:\n%s", s)
	}

	// The recoverer resumes the handler after the mail step; the client's
	// retry gets its answer.
	recoverUntil("recovering the record", func(r idem.RecoveryReport) bool { return r.Recovered == 1 })
	got, err := idem.Do(ctx, engine, op, pay)
	if want := "ch_1/mail_provider_42"; err != nil || got != want {
		t.Fatalf("retry after the recovery = %q, %v; want the replay of %q", got, err, want)
	}
	if charges.Load() != 1 || mails.Load() != 1 || ledger.Load() != 1 {
		t.Fatalf("charges %d, mail step runs %d, ledger rows %d; want 1, 1, 1", charges.Load(), mails.Load(), ledger.Load())
	}

	// The console shows it completed, with the operator's audit entry.
	run("the record again", chromedp.Navigate(console+"/record/"+key), chromedp.WaitVisible(chromedp.CSS(`table.audit`)))
	if s := text(`table.facts`); !strings.Contains(s, "completed") {
		t.Fatalf("record after the retry:\n%s", s)
	}
	if s := text(`table.audit`); !strings.Contains(s, "alice") || !strings.Contains(s, "resolve-step step mail done with 25 bytes of result") ||
		!strings.Contains(s, "uncertain") || !strings.Contains(s, "in-progress (lease lapsed") {
		t.Fatalf("audit on the record's page:\n%s", s)
	}
	shot("record-completed.png")
	run("audit page", chromedp.Navigate(console+"/audit"), chromedp.WaitVisible(chromedp.CSS(`table.audit`)))
	shot("audit.png")
	entries, err := audit.Entries(ctx, key, 10)
	if err != nil || len(entries) != 1 || entries[0].Operator != "alice" || entries[0].Action != "resolve-step" || entries[0].Err != "" {
		t.Fatalf("audit entries = %+v, %v", entries, err)
	}
}
