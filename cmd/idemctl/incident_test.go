package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// ctl runs idemctl with the store's flags after the command and returns
// its exit code, stdout and stderr.
func ctl(ctx context.Context, t *testing.T, b testStore, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append(append(args[:1:1], b.args...), args[1:]...)
	code := run(ctx, args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// listAll runs `idemctl list` with args and follows its cursors to the
// end (a Redis page may end early, after a bounded scan of a large shared
// keyspace), and returns every page's stdout and the pages' count.
func listAll(ctx context.Context, t *testing.T, b testStore, args ...string) (string, int) {
	t.Helper()
	var all strings.Builder
	cursor := ""
	for page := 1; ; page++ {
		if page > 1000 { // a hang guard: a shared Redis may hold millions of other keys
			t.Fatal("list never ends")
		}
		a := append([]string{"list"}, args...)
		if cursor != "" {
			a = append(a, "-cursor", cursor)
		}
		code, out, errOut := ctl(ctx, t, b, "", a...)
		if code != exitOK {
			t.Fatalf("idemctl %q page %d = %d\n%s%s", a, page, code, out, errOut)
		}
		all.WriteString(out)
		m := regexp.MustCompile(`-cursor (\S+)`).FindStringSubmatch(out)
		if m == nil {
			return all.String(), page
		}
		cursor = m[1]
	}
}

func randomHex(n int) string {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestIncident is the operator's story with only a log line at hand, on
// every shared store: a crashed process holds a lease; `list -state
// in-progress` finds it, `show key=<16 hex>` shows it with the store key,
// `evict` by the prefix frees it, the retry executes, and `show -body`
// dumps its stored body byte for byte.
func TestIncident(t *testing.T) {
	for name, newBackend := range backends {
		t.Run(name, func(t *testing.T) { testIncident(t, newBackend(t)) })
	}
}

func testIncident(t *testing.T, b testStore) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engine, err := idem.New(b.store)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = engine.Close(ctx) }()
	idemKey := "pay-" + randomHex(8)
	body := []byte(`{"amount":1000}`)
	request := func() *idem.Request {
		return &idem.Request{Method: "POST", Route: "/v1/payments", Path: "/v1/payments", ContentType: "application/json",
			Keys: []string{idemKey}, Principal: "acct_1", Body: body}
	}
	scoped := idem.ScopedKey("acct_1", "POST", "/v1/payments", idemKey)
	logKey := scoped[:16] // what idem's log lines carry as key=
	fp := idem.Fingerprint("POST", "/v1/payments", "", "application/json", body)
	if _, ok, err := b.store.Acquire(ctx, scoped, "crashed-instance.17", fp, time.Hour); err != nil || !ok {
		t.Fatalf("Acquire for the crashed process = %v, %v", ok, err)
	}

	if out, _ := listAll(ctx, t, b, "-state", "in-progress"); !strings.Contains(out, scoped+"  in-progress  lease held") || !strings.Contains(out, "owner crashed-instance.17") {
		t.Fatalf("list -state in-progress:\n%s\nwant the held record", out)
	}
	code, out, errOut := ctl(ctx, t, b, "", "show", "key="+logKey)
	for _, want := range []string{"scoped key   " + scoped, "store key    ", scoped, "state        in-progress", "lease owner  crashed-instance.17"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("show key=%s = %d\n%s%s\nwant exit 0 and %q", logKey, code, out, errOut, want)
		}
	}
	if code, out, _ := ctl(ctx, t, b, "", "show", "-scoped-key", strings.ToUpper(logKey)); code != exitOK || !strings.Contains(out, "scoped key   "+scoped) {
		t.Fatalf("show -scoped-key <16 hex> = %d\n%s", code, out)
	}
	if code, out, errOut := ctl(ctx, t, b, "", "show", "-body", logKey); code != exitFail || out != "" || !strings.Contains(errOut, "no body: the record is in-progress") {
		t.Fatalf("show -body of an in-progress record = %d, stdout %q\n%s", code, out, errOut)
	}
	if code, out, errOut := ctl(ctx, t, b, "", "evict", "-yes", logKey); code != exitOK || !strings.Contains(out, "evicted: a request with this key executes again") {
		t.Fatalf("evict -yes %s = %d\n%s%s", logKey, code, out, errOut)
	}

	// The retry executes; its body holds bytes no text would.
	x, resp := engine.Begin(ctx, request())
	if x == nil {
		t.Fatalf("retry after eviction was not executed: %+v", resp)
	}
	stored := append([]byte{0, 0xff, 0xfe, '\n', '\r'}, `{"id":"pay_1"}`...)
	_, _ = x.Write(stored)
	x.Finish(http.StatusCreated, http.Header{"Content-Type": {"application/octet-stream"}})

	code, out, errOut = ctl(ctx, t, b, "", "show", "-body", logKey)
	if code != exitOK || out != string(stored) {
		t.Fatalf("show -body = %d, stdout %q, want %q byte for byte\n%s", code, out, stored, errOut)
	}
	if !strings.Contains(errOut, "status       201") || !strings.Contains(errOut, "header       Content-Type: application/octet-stream") {
		t.Fatalf("show -body: the record goes to stderr, got\n%s", errOut)
	}
	if out, _ := listAll(ctx, t, b, "-state", "completed"); !strings.Contains(out, scoped+"  completed") {
		t.Fatalf("list -state completed:\n%s", out)
	}
	if out, _ := listAll(ctx, t, b, "-state", "in-progress"); strings.Contains(out, scoped) {
		t.Fatalf("list -state in-progress lists the completed record:\n%s", out)
	}

	// A prefix two records share is ambiguous: both are listed, nothing shown.
	shared := randomHex(16)
	twins := []string{shared + randomHex(48), shared + randomHex(48)}
	for _, k := range twins {
		if _, ok, err := b.store.Acquire(ctx, k, "t", fp, time.Hour); err != nil || !ok {
			t.Fatalf("Acquire %s = %v, %v", k, ok, err)
		}
	}
	code, out, _ = ctl(ctx, t, b, "", "show", shared)
	if code != exitFail || !strings.Contains(out, "ambiguous") || !strings.Contains(out, twins[0]) || !strings.Contains(out, twins[1]) {
		t.Fatalf("show <shared prefix> = %d\n%s\nwant exit 1 and both keys", code, out)
	}
	if code, out, _ := ctl(ctx, t, b, "", "evict", "-yes", shared); code != exitFail || strings.Contains(out, "evicted:") {
		t.Fatalf("evict <shared prefix> = %d\n%s", code, out)
	}

	// Nothing under the prefix: say where idemctl looked; the layout is
	// the service's (it holds the records above), so no hint names a flag.
	code, out, errOut = ctl(ctx, t, b, "", "show", randomHex(16))
	if code != exitFail || !strings.Contains(out, "no record") || !strings.Contains(errOut, "nothing found in") || strings.Contains(errOut, "pass ") {
		t.Fatalf("show <unknown prefix> = %d\n%s%s\nwant the layout searched and no hint", code, out, errOut)
	}
	// In a layout that holds nothing (a table or collection that does not
	// exist, a prefix no key has), the hint names the flag.
	code, out, errOut = ctl(ctx, t, b, "", append([]string{"show", randomHex(16)}, b.wrongLayout...)...)
	if code != exitFail || !regexp.MustCompile(`pass (the same )?`+b.wrongLayout[0]).MatchString(errOut) {
		t.Fatalf("show <unknown prefix> %v = %d\n%s%s\nwant the layout searched and a %s hint", b.wrongLayout, code, out, errOut, b.wrongLayout[0])
	}

	// An empty list is one message on stdout, nothing on stderr, exit 0.
	code, out, errOut = ctl(ctx, t, b, "", "list", randomHex(16))
	// (A Redis page may end its bounded scan of a large shared keyspace
	// first: "none in this part of the store" and a cursor.)
	empty := strings.Contains(out, "no records") || b.scans && strings.Contains(out, "none in this part of the store")
	if code != exitOK || !empty || errOut != "" {
		t.Fatalf("list <unknown prefix> = %d\n%s\nstderr %q\nwant exit 0, \"no records\" and nothing on stderr", code, out, errOut)
	}

	// Paging: -limit 1 walks every record, through the cursors.
	out, pages := listAll(ctx, t, b, "-limit", "1")
	seen := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^([0-9a-f]{64})  `).FindAllStringSubmatch(out, -1) {
		seen[m[1]]++
	}
	if pages < 3 && !b.scans {
		t.Fatalf("list -limit 1 of 3 records took %d pages", pages)
	}
	for _, k := range append(twins, scoped) {
		if seen[k] == 0 {
			t.Fatalf("paged list missed %s; saw %v", k, seen)
		}
	}

	// A lease that lapsed without renewal (its holder crashed) is listed as
	// stuck by stores that keep it until purged or taken over.
	if !b.keepsLapse {
		return
	}
	lapsed := randomHex(64)
	if _, ok, err := b.store.Acquire(ctx, lapsed, "gone", fp, time.Millisecond); err != nil || !ok {
		t.Fatalf("Acquire %s = %v, %v", lapsed, ok, err)
	}
	for {
		out, _ := listAll(ctx, t, b, "-state", "in-progress", lapsed[:16])
		if strings.Contains(out, lapsed+"  in-progress  lease lapsed") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("list never showed the lapsed lease:\n%s", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, out, _ := ctl(ctx, t, b, "", "show", lapsed[:16]); code != exitFail || !strings.Contains(out, "no live record") || !strings.Contains(out, "lease lapsed") {
		t.Fatalf("show of a lapsed lease = %d\n%s\nwant no live record (a request with it executes)", code, out)
	}
}
