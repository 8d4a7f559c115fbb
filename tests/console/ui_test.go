package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemui"
	"github.com/idemkit/idem/stores/memstore"
)

const holderToken = "web-3:4242:K7QXR2MZLJ2XW5RV.17"

func randomKey() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// uncertainRecord leaves in s the record of a payment whose holder
// charged the card (a done step) and stopped inside the mail step, then
// was suspended uncertain: what a crash inside a step that is not
// repeatable leaves.
func uncertainRecord(t *testing.T, s *memstore.Store) string {
	t.Helper()
	ctx := context.Background()
	key := randomKey()
	if _, ok, err := s.AcquireKeep(ctx, key, holderToken, "fp-1", time.Hour, idem.Keep{Uncertain: time.Hour}); err != nil || !ok {
		t.Fatalf("AcquireKeep = %v, %v", ok, err)
	}
	for _, step := range []string{"charge", "mail"} {
		if _, err := s.StartStep(ctx, key, holderToken, step, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.FinishStep(ctx, key, holderToken, "charge", []byte(`v"ch_1"`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Suspend(ctx, key, holderToken, time.Hour); err != nil {
		t.Fatal(err)
	}
	return key
}

// client is a browser's cookie-keeping client that does not follow
// redirects, with the Origin header a same-origin form post carries.
type client struct {
	t    *testing.T
	srv  *httptest.Server
	http *http.Client
}

func newClient(t *testing.T, h http.Handler) *client {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	return &client{t: t, srv: srv, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *client) do(method, path string, form url.Values, hdr ...string) (int, string, http.Header) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.srv.URL+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", c.srv.URL)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, html.UnescapeString(string(b)), resp.Header
}

// formOf returns the hidden and filled fields of the page's form.
func formOf(t *testing.T, page string) url.Values {
	t.Helper()
	v := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`).FindAllStringSubmatch(page, -1) {
		v.Set(m[1], m[2])
	}
	if v.Get("form_token") == "" {
		t.Fatalf("no form token in\n%s", page)
	}
	return v
}

func operator(name string) func(*http.Request) (string, bool) {
	return func(r *http.Request) (string, bool) { return name, r.Header.Get("X-Test-Operator") == name }
}

// TestReadOnly: without WithWrites the console lists and shows records,
// offers no action, and refuses a confirmation page and a posted action
// (403) even from an operator.
func TestReadOnly(t *testing.T) {
	s := memstore.New()
	defer func() { _ = s.Close() }()
	key := uncertainRecord(t, s)
	c := newClient(t, idemui.Handler(s))

	code, page, hdr := c.do("GET", "/?state=uncertain", nil)
	if code != 200 || !strings.Contains(page, key[:16]) || !strings.Contains(page, "web-3:4242") || !strings.Contains(page, "read-only") {
		t.Fatalf("GET /?state=uncertain = %d\n%s", code, page)
	}
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "script-src") {
		t.Fatalf("Content-Security-Policy %q: want no script from anywhere", csp)
	}
	code, page, _ = c.do("GET", "/record/"+key, nil)
	for _, want := range []string{"uncertain", "charge", `"ch_1"`, "mail", "started, not done"} {
		if code != 200 || !strings.Contains(page, want) {
			t.Fatalf("GET /record = %d, want %q in\n%s", code, want, page)
		}
	}
	if strings.Contains(page, "confirm?") {
		t.Fatalf("a read-only console offers actions:\n%s", page)
	}
	if code, page, _ := c.do("GET", "/record/"+key+"/confirm?action=evict", nil); code != http.StatusForbidden || !strings.Contains(page, "read-only") {
		t.Fatalf("confirm on a read-only console = %d\n%s", code, page)
	}
	if code, _, _ := c.do("POST", "/record/"+key+"/act", url.Values{"action": {"evict"}}, "X-Test-Operator", "ann"); code != http.StatusForbidden {
		t.Fatalf("act on a read-only console = %d, want 403", code)
	}
	if info, found, err := s.Inspect(context.Background(), key); err != nil || !found || info.State != idem.StateUncertain {
		t.Fatalf("after the refused writes: %v %v %v; want the record uncertain", info.State, found, err)
	}
}

// TestResolveStepInConsole: an operator settles the unknown step of an
// uncertain record through its confirmation page; the record is then in
// progress with its lease lapsed and the step done with the result, and
// the audit log (the console's page and the logger) says who did what,
// with the state before and after. Without an operator, with a
// cross-origin request or without the form's token, nothing is done.
func TestResolveStepInConsole(t *testing.T) {
	s := memstore.New()
	defer func() { _ = s.Close() }()
	key := uncertainRecord(t, s)
	var logged strings.Builder
	logger := slogTo(&logged)
	c := newClient(t, idemui.Handler(s, idemui.WithWrites(operator("ann")), idemui.WithLogger(logger)))
	as := []string{"X-Test-Operator", "ann"}

	code, page, _ := c.do("GET", "/record/"+key, nil, as...)
	if code != 200 || !strings.Contains(page, "confirm?action=resolve-step&step=mail&done=1") || strings.Contains(page, "step=charge") {
		t.Fatalf("record page = %d: want a settle link for mail and none for charge (done)\n%s", code, page)
	}
	if code, _, _ := c.do("GET", "/record/"+key+"/confirm?action=resolve-step&step=mail&done=1", nil); code != http.StatusUnauthorized {
		t.Fatalf("confirm without an operator = %d, want 401", code)
	}
	code, page, _ = c.do("GET", "/record/"+key+"/confirm?action=resolve-step&step=mail&done=1", nil, as...)
	if want := idemui.ResolveStepQuestion("mail", true, "the result below"); code != 200 || !strings.Contains(page, want) || !strings.Contains(page, idemui.ResolveStepSteps) {
		t.Fatalf("confirm = %d, want %q\n%s", code, want, page)
	}
	form := formOf(t, page)
	form.Set("result", `{"id":"mail_42"}`)

	// Refused: another operator's token, a cross-origin post, no token.
	forged := url.Values{}
	for k, v := range form {
		forged[k] = v
	}
	forged.Set("form_token", strings.Repeat("0", 64))
	if code, _, _ := c.do("POST", "/record/"+key+"/act", forged, as...); code != http.StatusForbidden {
		t.Fatalf("act with a wrong form token = %d, want 403", code)
	}
	if code, _, _ := c.do("POST", "/record/"+key+"/act", form, "X-Test-Operator", "ann", "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"); code != http.StatusForbidden {
		t.Fatalf("cross-origin act = %d, want 403", code)
	}
	if code, _, _ := c.do("POST", "/record/"+key+"/act", form); code != http.StatusUnauthorized {
		t.Fatalf("act without an operator = %d, want 401", code)
	}
	if info, _, _ := s.Inspect(context.Background(), key); info.State != idem.StateUncertain {
		t.Fatalf("after refused acts the record is %v, want uncertain", info.State)
	}

	code, _, hdr := c.do("POST", "/record/"+key+"/act", form, as...)
	if code != http.StatusSeeOther || hdr.Get("Location") != "/record/"+key+"?done=resolve-step" {
		t.Fatalf("act = %d, Location %q", code, hdr.Get("Location"))
	}
	steps, err := s.Steps(context.Background(), key)
	if err != nil || len(steps) != 2 || !steps[1].Done {
		t.Fatalf("steps after resolve = %+v, %v; want mail done", steps, err)
	}
	if out, err := idem.DecodeStep(steps[1]); err != nil || string(out.Value) != `{"id":"mail_42"}` {
		t.Fatalf("mail's result = %q, %v", out.Value, err)
	}
	code, page, _ = c.do("GET", "/record/"+key+"?done=resolve-step", nil, as...)
	for _, want := range []string{"resolved: the next retry", "lease lapsed", "ann", "resolve-step step mail done with 16 bytes of result",
		"uncertain (uncertain: retries get 409", "in-progress (lease lapsed"} {
		if code != 200 || !strings.Contains(page, want) {
			t.Fatalf("record page after resolve = %d, want %q\n%s", code, want, page)
		}
	}
	if _, page, _ := c.do("GET", "/audit", nil, as...); !strings.Contains(page, key[:16]) || !strings.Contains(page, "ann") {
		t.Fatalf("audit page:\n%s", page)
	}
	if l := logged.String(); !strings.Contains(l, "idemui: operator action") || !strings.Contains(l, "operator=ann") || !strings.Contains(l, "action=resolve-step") || !strings.Contains(l, "key="+key) {
		t.Fatalf("audit log line:\n%s", l)
	}

	// The same form again: the step is done now, so nothing changes.
	code, page, _ = c.do("POST", "/record/"+key+"/act", form, as...)
	if code != http.StatusConflict || !strings.Contains(page, "not resolved") {
		t.Fatalf("second act = %d\n%s", code, page)
	}
}

// TestCompleteReleaseEvict: complete stores the operator's answer (its
// credential headers redacted on the page, its body hidden by default),
// release deletes an uncertain record, evict deletes a completed one;
// each says first what happens to the steps, as idemctl does.
func TestCompleteReleaseEvict(t *testing.T) {
	s := memstore.New()
	defer func() { _ = s.Close() }()
	c := newClient(t, idemui.Handler(s, idemui.WithWrites(operator("bob"))))
	as := []string{"X-Test-Operator", "bob"}
	ctx := context.Background()

	key := uncertainRecord(t, s)
	code, page, _ := c.do("GET", "/record/"+key+"/confirm?action=complete", nil, as...)
	if code != 200 || !strings.Contains(page, idemui.CompleteQuestion) || !strings.Contains(page, idemui.CompleteSteps) {
		t.Fatalf("confirm complete = %d\n%s", code, page)
	}
	form := formOf(t, page)
	form.Set("status", "201")
	form.Set("headers", "Content-Type: application/json\nSet-Cookie: s=secret")
	form.Set("body", `{"id":"pay_1","card":"4242"}`)
	form.Set("retention", "1h")
	if code, page, _ := c.do("POST", "/record/"+key+"/act", form, as...); code != http.StatusSeeOther {
		t.Fatalf("complete = %d\n%s", code, page)
	}
	info, found, err := s.Inspect(ctx, key)
	if err != nil || !found || info.State != idem.StateCompleted {
		t.Fatalf("after complete: %v %v %v", info.State, found, err)
	}
	if r, err := idem.DecodeResponse(info.Response); err != nil || r.Status != 201 || string(r.Body) != `{"id":"pay_1","card":"4242"}` {
		t.Fatalf("stored answer %+v, %v", r, err)
	}
	_, page, _ = c.do("GET", "/record/"+key, nil, as...)
	if !strings.Contains(page, "Set-Cookie: (redacted)") || strings.Contains(page, "secret") || strings.Contains(page, "4242\"") || !strings.Contains(page, "28 bytes (hidden") {
		t.Fatalf("the stored answer's page shows a credential or the body:\n%s", page)
	}

	// Evict the completed record.
	code, page, _ = c.do("GET", "/record/"+key+"/confirm?action=evict", nil, as...)
	if code != 200 || !strings.Contains(page, idemui.EvictQuestion(idem.StateCompleted)) || !strings.Contains(page, idemui.EvictSteps) {
		t.Fatalf("confirm evict = %d\n%s", code, page)
	}
	if code, _, _ := c.do("POST", "/record/"+key+"/act", formOf(t, page), as...); code != http.StatusSeeOther {
		t.Fatalf("evict = %d", code)
	}
	if _, found, _ := s.Inspect(ctx, key); found {
		t.Fatal("the record survived its eviction")
	}

	// Release another uncertain record.
	key = uncertainRecord(t, s)
	code, page, _ = c.do("GET", "/record/"+key+"/confirm?action=release", nil, as...)
	if code != 200 || !strings.Contains(page, idemui.ReleaseQuestion) {
		t.Fatalf("confirm release = %d\n%s", code, page)
	}
	if code, _, _ := c.do("POST", "/record/"+key+"/act", formOf(t, page), as...); code != http.StatusSeeOther {
		t.Fatalf("release = %d", code)
	}
	if _, found, _ := s.Inspect(ctx, key); found {
		t.Fatal("the record survived its release")
	}
	_, page, _ = c.do("GET", "/record/"+key+"?done=release", nil, as...)
	if !strings.Contains(page, "released: the next request with this key executes") || !strings.Contains(page, "No live record") {
		t.Fatalf("record page after release:\n%s", page)
	}
}

// TestListing: the tabs keep their state, a key prefix filters, paging
// follows the store's cursor without repeating a record, and the links
// follow the prefix the console is mounted under.
func TestListing(t *testing.T) {
	s := memstore.New()
	defer func() { _ = s.Close() }()
	ctx := context.Background()
	var inProgress []string
	for range 7 {
		k := randomKey()
		inProgress = append(inProgress, k)
		if _, ok, err := s.Acquire(ctx, k, holderToken, "fp", time.Hour); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	done := randomKey()
	if _, _, err := s.Acquire(ctx, done, "t", "fp", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, done, "t", idem.EncodeResponse(&idem.Response{Status: 200}), time.Hour); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/idem/", http.StripPrefix("/ops/idem", idemui.Handler(s, idemui.WithPageSize(3))))
	c := newClient(t, mux)

	seen := map[string]bool{}
	path := "/ops/idem/?state=in-progress"
	for pages := 0; path != ""; pages++ {
		if pages > 10 {
			t.Fatal("paging never ends")
		}
		code, page, _ := c.do("GET", path, nil)
		if code != 200 || !strings.Contains(page, `href="/ops/idem/static/style.css"`) {
			t.Fatalf("GET %s = %d\n%s", path, code, page)
		}
		if strings.Contains(page, done[:16]) {
			t.Fatalf("the in-progress tab lists the completed record:\n%s", page)
		}
		for _, m := range regexp.MustCompile(`href="/ops/idem/record/([0-9a-f]{64})"`).FindAllStringSubmatch(page, -1) {
			if seen[m[1]] {
				t.Fatalf("record %s on two pages", m[1])
			}
			seen[m[1]] = true
		}
		path = ""
		if m := regexp.MustCompile(`href="(/ops/idem/\?[^"]+)">Next page`).FindStringSubmatch(page); m != nil {
			path = m[1]
		}
	}
	for _, k := range inProgress {
		if !seen[k] {
			t.Fatalf("record %s never listed", k)
		}
	}
	_, page, _ := c.do("GET", "/ops/idem/?state=completed&prefix=key="+done[:16], nil)
	if !strings.Contains(page, done[:16]) || strings.Contains(page, inProgress[0][:16]) {
		t.Fatalf("completed, filtered by prefix:\n%s", page)
	}
	if code, page, _ := c.do("GET", "/ops/idem/?state=all&prefix=xyz", nil); code != http.StatusBadRequest || !strings.Contains(page, "lowercase hex") {
		t.Fatalf("a bad prefix = %d\n%s", code, page)
	}
}

// TestTokenSession: with WithToken every page needs a session opened with
// the token; a wrong token opens none; the session's operator acts.
func TestTokenSession(t *testing.T) {
	s := memstore.New()
	defer func() { _ = s.Close() }()
	key := uncertainRecord(t, s)
	const token = "0123456789abcdef-secret"
	c := newClient(t, idemui.Handler(s, idemui.WithToken(token), idemui.WithWrites(nil)))

	if code, _, hdr := c.do("GET", "/record/"+key, nil); code != http.StatusSeeOther || hdr.Get("Location") != "/login" {
		t.Fatalf("GET without a session = %d, Location %q", code, hdr.Get("Location"))
	}
	if code, _, _ := c.do("POST", "/record/"+key+"/act", url.Values{"action": {"release"}}); code != http.StatusUnauthorized {
		t.Fatalf("act without a session = %d", code)
	}
	if code, _, hdr := c.do("POST", "/login", url.Values{"operator": {"carol"}, "token": {"wrong-token-0123456"}}); code != http.StatusSeeOther || hdr.Get("Location") != "/login?error=1" {
		t.Fatalf("login with a wrong token = %d, %q", code, hdr.Get("Location"))
	}
	if code, _, _ := c.do("GET", "/", nil); code != http.StatusSeeOther {
		t.Fatalf("a wrong token opened a session: %d", code)
	}
	if code, _, hdr := c.do("POST", "/login", url.Values{"operator": {"carol"}, "token": {token}}); code != http.StatusSeeOther || hdr.Get("Location") != "/" {
		t.Fatalf("login = %d, %q", code, hdr.Get("Location"))
	}
	code, page, _ := c.do("GET", "/record/"+key+"/confirm?action=release", nil)
	if code != 200 || !strings.Contains(page, "carol") {
		t.Fatalf("confirm in a session = %d\n%s", code, page)
	}
	if code, _, _ := c.do("POST", "/record/"+key+"/act", formOf(t, page)); code != http.StatusSeeOther {
		t.Fatalf("release in a session = %d", code)
	}
	if _, page, _ := c.do("GET", "/audit", nil); !strings.Contains(page, "carol") || !strings.Contains(page, "release") {
		t.Fatalf("audit:\n%s", page)
	}
}

func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// TestDueAndMount: the due tab lists a record whose lease lapsed with a
// recovery payload, with its attempts; links and redirects stay under the
// prefix the console is mounted under, and a request URI that would make
// them name another host gives them none.
func TestDueAndMount(t *testing.T) {
	s := memstore.New()
	defer func() { _ = s.Close() }()
	ctx := context.Background()
	key := randomKey()
	if _, ok, err := s.Acquire(ctx, key, holderToken, "fp", 50*time.Millisecond); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := s.SetRecovery(ctx, key, holderToken, []byte("payload"), time.Hour, time.Minute); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) { // a hang guard: the lease lapses
		due, err := s.Lapsed(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(due) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record never became due")
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", idemui.Handler(s, idemui.WithToken("0123456789abcdef0123"))))
	c := newClient(t, mux)
	if code, _, _ := c.do("POST", "/ops/login", url.Values{"operator": {"dan"}, "token": {"0123456789abcdef0123"}}); code != http.StatusSeeOther {
		t.Fatalf("login = %d", code)
	}
	code, page, _ := c.do("GET", "/ops/?state=due", nil)
	if code != 200 || !strings.Contains(page, `href="/ops/record/`+key+`"`) || !strings.Contains(page, "due for recovery") || !regexp.MustCompile(`<td>0</td>\s*</tr>`).MatchString(page) {
		t.Fatalf("due tab = %d\n%s", code, page)
	}

	// Mounted with a prefix of one slash, a request whose URI starts with
	// two: the login redirect stays on this server (no "//host").
	srv := httptest.NewServer(http.StripPrefix("/", idemui.Handler(s, idemui.WithToken("0123456789abcdef0123"))))
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, _ = io.WriteString(conn, "GET //evil.example/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	resp, _ := io.ReadAll(conn)
	if m := regexp.MustCompile(`(?i)\r\nLocation: (\S*)`).FindSubmatch(resp); m == nil || string(m[1]) != "/login" {
		t.Fatalf("answer to GET //evil.example/:\n%s", resp)
	}
}
