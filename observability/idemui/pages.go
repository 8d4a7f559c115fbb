package idemui

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	idem "github.com/idemkit/idem/core"
)

// maxListCalls bounds the List calls one listing page makes to fill
// itself (a Redis page may be an empty batch of a large keyspace).
const maxListCalls = 10

// lapsedBatch is how many pages of in-progress records one List call of
// the lapsed listing asks for: it keeps those whose lease lapsed.
const lapsedBatch = 10

// page is what every template gets.
type page struct {
	Base, Viewer, Title string
	Writes, Session     bool
	Data                any
}

var pageNames = []string{"list", "record", "confirm", "result", "audit", "login"}

func parseTemplates() map[string]*template.Template {
	funcs := template.FuncMap{
		"short": func(key string) string { return key[:min(16, len(key))] },
		"ago":   func(t time.Time) string { return roundDur(time.Since(t)).String() + " ago" },
		"utc":   func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	}
	m := make(map[string]*template.Template, len(pageNames))
	for _, name := range pageNames {
		m[name] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	return m
}

// render writes template name with data in the layout.
func (c *console) render(w http.ResponseWriter, r *http.Request, name string, status int, data any) {
	title, _ := data.(map[string]any)["Title"].(string)
	p := page{Base: base(r), Viewer: c.viewer(r), Title: title, Writes: c.cfg.writes, Session: c.cfg.token != "", Data: data}
	var buf bytes.Buffer
	if err := c.tmpl[name].ExecuteTemplate(&buf, "layout.html", p); err != nil {
		c.cfg.logger.ErrorContext(r.Context(), "idemui: render", "page", name, "err", err)
		http.Error(w, "idemui: render: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// fail renders the result page with an error message.
func (c *console) fail(w http.ResponseWriter, r *http.Request, status int, key, msg string) {
	c.render(w, r, "result", status, map[string]any{"Title": "Not done", "Key": key, "Message": msg, "Failed": true})
}

// row is one record as the console shows it.
type row struct {
	Key, State, Status, Class string
	Expires, SinceRenewal     string
	Holder, Attempts          string
}

// tab is one listing of the records by state.
type tab struct{ Name, Label string }

var tabs = []tab{
	{"in-progress", "In progress"}, {"lapsed", "Lapsed"}, {"due", "Due for recovery"},
	{"uncertain", "Uncertain / parked"}, {"completed", "Completed"}, {"all", "All"},
}

// describe returns the console's view of a record.
func (c *console) describe(key string, info idem.RecordInfo) row {
	rw := row{Key: key, State: info.State.String(), Holder: holder(info.Token), Attempts: "—", SinceRenewal: "—"}
	ttl := roundDur(info.TTL)
	floor := c.cfg.lease - c.cfg.lease/3 - 2*c.cfg.storeTimeout
	switch info.State {
	case idem.StateInProgress:
		if info.TTL <= c.cfg.lease {
			rw.SinceRenewal = roundDur(c.cfg.lease - info.TTL).String()
		}
		switch {
		case info.TTL <= 0:
			rw.Status, rw.Class, rw.Expires = "lease lapsed: its holder stopped renewing", "lapsed", "lapsed "+(-ttl).String()+" ago"
		case info.TTL > floor:
			rw.Status, rw.Class, rw.Expires = "lease held, renewed", "held", "in "+ttl.String()
		default:
			rw.Status, rw.Class, rw.Expires = "lease held, NOT renewed: its holder stopped", "stale", "in "+ttl.String()
		}
	case idem.StateUncertain:
		rw.Status, rw.Class, rw.Expires = "uncertain: retries get 409 until an operator settles it", "uncertain", "kept "+ttl.String()
	case idem.StateCompleted:
		rw.Status, rw.Class, rw.Expires = "completed: retries get the replay", "completed", "in "+ttl.String()
	case idem.StateExpired:
		rw.Status, rw.Class, rw.Expires = "tombstone: retries get 410", "expired", "in "+ttl.String()
	}
	return rw
}

// summary is a record's state in one line, for the audit log.
func (c *console) summary(info idem.RecordInfo, found bool) string {
	if !found {
		return "absent"
	}
	rw := c.describe("", info)
	s := rw.State + " (" + rw.Status + ", " + rw.Expires
	if info.Token != "" {
		s += ", holder " + rw.Holder
	}
	return s + ")"
}

// holder names the host:pid that holds a lease, from its token.
func holder(token string) string {
	if token == "" {
		return "—"
	}
	if host, pid, ok := idem.TokenOwner(token); ok {
		return fmt.Sprintf("%s:%d", host, pid)
	}
	return token
}

func roundDur(d time.Duration) time.Duration {
	if d >= time.Minute || d <= -time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(100 * time.Millisecond)
}

// list is the records page: GET /?state=&prefix=&cursor=.
func (c *console) list(w http.ResponseWriter, r *http.Request) {
	qs := r.URL.Query()
	state := cmp.Or(qs.Get("state"), "in-progress")
	prefix := strings.ToLower(strings.TrimPrefix(strings.TrimSpace(qs.Get("prefix")), "key="))
	data := map[string]any{"Title": "Records", "Tabs": tabs, "State": state, "Prefix": prefix, "Lister": c.ls != nil}
	if state == "due" {
		c.listDue(w, r, data)
		return
	}
	if c.ls == nil {
		data["Error"] = "this store cannot list records (it does not implement idem.Lister); open a record by its scoped key"
		c.render(w, r, "list", http.StatusOK, data)
		return
	}
	q := idem.ListQuery{KeyPrefix: prefix, Limit: c.cfg.pageSize, Cursor: qs.Get("cursor")}
	keep := func(idem.ListedRecord) bool { return true }
	switch state {
	case "in-progress":
		q.State = idem.StateInProgress
	case "lapsed":
		q.State = idem.StateInProgress
		keep = func(l idem.ListedRecord) bool { return l.TTL <= 0 }
		q.Limit = lapsedBatch * c.cfg.pageSize // most in-progress records hold their lease
	case "uncertain":
		q.State = idem.StateUncertain
	case "completed":
		q.State = idem.StateCompleted
	case "all":
	default:
		c.fail(w, r, http.StatusBadRequest, "", "unknown state "+state)
		return
	}
	if err := q.Check(); err != nil {
		data["Error"] = err.Error()
		c.render(w, r, "list", http.StatusBadRequest, data)
		return
	}
	recs, next, err := c.page(r.Context(), q, keep, c.cfg.pageSize)
	if err != nil {
		data["Error"] = "the store's listing failed: " + err.Error()
		c.render(w, r, "list", http.StatusBadGateway, data)
		return
	}
	rows := make([]row, len(recs))
	for i, l := range recs {
		rows[i] = c.describe(l.Key, l.RecordInfo)
	}
	data["Rows"] = rows
	if next != "" {
		data["Next"] = "?" + url.Values{"state": {state}, "prefix": {prefix}, "cursor": {next}}.Encode()
	}
	c.render(w, r, "list", http.StatusOK, data)
}

// page lists records of q that keep accepts: every one of the calls it
// makes, until it has want or maxListCalls calls were made, soonest
// expiry first; next is the cursor to go on.
func (c *console) page(ctx context.Context, q idem.ListQuery, keep func(idem.ListedRecord) bool, want int) (recs []idem.ListedRecord, next string, err error) {
	seen := map[string]bool{}
	for range maxListCalls {
		p, err := c.ls.List(ctx, q)
		if err != nil {
			return nil, "", err
		}
		for _, l := range p.Records {
			if !seen[l.Key] && keep(l) { // Redis SCAN may return a key twice
				seen[l.Key] = true
				recs = append(recs, l)
			}
		}
		next = p.Next
		if next == "" || len(recs) >= want {
			break
		}
		q.Cursor = next
	}
	slices.SortStableFunc(recs, func(a, b idem.ListedRecord) int { return cmp.Compare(a.TTL, b.TTL) })
	return recs, next, nil
}

// listDue lists the records due for recovery ([idem.Recoverable.Lapsed]):
// one bounded page, soonest due first, with their attempts.
func (c *console) listDue(w http.ResponseWriter, r *http.Request, data map[string]any) {
	if c.rc == nil {
		data["Error"] = "this store keeps no recovery payloads (it does not implement idem.Recoverable)"
		c.render(w, r, "list", http.StatusOK, data)
		return
	}
	due, err := c.rc.Lapsed(r.Context(), c.cfg.pageSize)
	if err != nil {
		data["Error"] = "the store's due listing failed: " + err.Error()
		c.render(w, r, "list", http.StatusBadGateway, data)
		return
	}
	rows := make([]row, 0, len(due))
	for _, d := range due {
		rw := row{Key: d.Key, State: "in-progress", Status: "lease lapsed, due for recovery", Class: "lapsed",
			Expires: "—", SinceRenewal: "—", Holder: "—", Attempts: fmt.Sprint(d.Attempts)}
		rows = append(rows, rw)
	}
	data["Rows"] = rows
	data["Due"] = true
	c.render(w, r, "list", http.StatusOK, data)
}

// lookup returns the record of key: Inspect's, else the listing's (a
// store may not inspect an in-progress record whose lease lapsed).
func (c *console) lookup(ctx context.Context, key string) (idem.RecordInfo, bool, error) {
	info, found, err := c.in.Inspect(ctx, key)
	if err != nil || found || c.ls == nil {
		return info, found, err
	}
	q := idem.ListQuery{KeyPrefix: key, Limit: 10}
	for range maxListCalls {
		p, err := c.ls.List(ctx, q)
		if err != nil {
			return info, false, err
		}
		for _, l := range p.Records {
			if l.Key == key {
				return l.RecordInfo, true, nil
			}
		}
		if p.Next == "" {
			break
		}
		q.Cursor = p.Next
	}
	return info, false, nil
}

// stepView is one journal entry as the console shows it.
type stepView struct {
	Name, Outcome, Result, StartedBy string
	Done, Failed, Settle             bool
}

// answerView is a completed record's stored answer.
type answerView struct {
	Status  int
	Headers []string
	Size    int
	Body    string
	Shown   bool
	Err     string
}

// credentialHeaders are the header names whose values the console never
// shows.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie"}

// record is one record's page: GET /record/{key}.
func (c *console) record(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if !validKey(key) {
		c.fail(w, r, http.StatusBadRequest, "", "a scoped key is 64 lowercase hex characters")
		return
	}
	ctx := r.Context()
	data := map[string]any{"Title": "Record " + key[:16], "Key": key, "Done": doneMessage(r.URL.Query().Get("done"))}
	info, found, err := c.lookup(ctx, key)
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, key, "the store's inspection failed: "+err.Error())
		return
	}
	data["Found"] = found
	if c.reader != nil {
		entries, err := c.reader.Entries(ctx, key, 20)
		if err == nil {
			data["Audit"] = entries
		}
	}
	if !found {
		c.render(w, r, "record", http.StatusOK, data)
		return
	}
	rw := c.describe(key, info)
	data["Row"] = rw
	data["Fingerprint"] = info.Fingerprint
	data["Token"] = info.Token
	settleable := info.State == idem.StateUncertain || (info.State == idem.StateInProgress && info.TTL <= 0)
	if c.jr != nil {
		entries, err := c.jr.Steps(ctx, key)
		if err != nil {
			data["StepsErr"] = err.Error()
		}
		steps := make([]stepView, 0, len(entries))
		settle := false // a step the operator can settle: the table's last column
		for _, e := range entries {
			st := stepOf(e, settleable && c.rs != nil && c.cfg.writes)
			settle = settle || st.Settle
			steps = append(steps, st)
		}
		data["Steps"], data["Settle"] = steps, settle
		data["Journal"] = true
	}
	if info.Response != nil {
		data["Answer"] = c.answerOf(info.Response)
	}
	data["CanEvict"] = c.cfg.writes
	data["CanResolve"] = c.cfg.writes && c.kp != nil && info.State == idem.StateUncertain
	c.render(w, r, "record", http.StatusOK, data)
}

func stepOf(e idem.StepEntry, settle bool) stepView {
	s := stepView{Name: e.Name, StartedBy: holder(e.Token), Done: e.Done}
	if !e.Done {
		s.Outcome, s.Settle = "started, not done: its outcome is unknown if its holder stopped", settle
		return s
	}
	out, err := idem.DecodeStep(e)
	switch {
	case err != nil:
		s.Outcome, s.Failed = fmt.Sprintf("done, result of %d bytes that does not decode (%v)", len(e.Result), err), true
	case out.Err != nil:
		s.Outcome, s.Result, s.Failed = "done, permanent error", out.Err.Message, true
	default:
		s.Outcome, s.Result = "done, result", shown(out.Value, 2048)
	}
	return s
}

func (c *console) answerOf(resp []byte) answerView {
	a, err := idem.DecodeResponse(resp)
	if err != nil {
		return answerView{Err: fmt.Sprintf("%d bytes that do not decode (%v)", len(resp), err)}
	}
	v := answerView{Status: a.Status, Size: len(a.Body), Shown: c.cfg.showBodies}
	for name, vals := range a.Header {
		for _, val := range vals {
			if slices.Contains(credentialHeaders, name) {
				val = "(redacted)"
			}
			v.Headers = append(v.Headers, name+": "+val)
		}
	}
	slices.Sort(v.Headers)
	if c.cfg.showBodies {
		v.Body = shown(a.Body, 4096)
	}
	return v
}

// shown renders b as text: as it is when it is UTF-8 without control
// characters, else Go-quoted; past limit bytes, cut with the total size.
func shown(b []byte, limit int) string {
	cut := b
	if len(cut) > limit {
		cut = cut[:limit]
		for len(cut) > 0 && !utf8.RuneStart(b[len(cut)]) {
			cut = cut[:len(cut)-1]
		}
	}
	s := string(cut)
	if !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 && r != '\t' && r != '\n' || r == 0x7f }) {
		s = fmt.Sprintf("%q", cut)
	}
	if len(cut) < len(b) {
		s += fmt.Sprintf(" … (first %d of %d bytes)", len(cut), len(b))
	}
	return s
}

func validKey(key string) bool {
	return len(key) == 64 && strings.Trim(key, "0123456789abcdef") == ""
}

// doneMessages are the record page's messages after an action, as
// cmd/idemctl prints them.
var doneMessages = map[string]string{
	"evict":            "evicted: a request with this key executes again",
	"release":          "released: the next request with this key executes",
	"complete":         "completed: retries get the stored answer",
	"resolve-step":     "resolved: the next retry (or a recoverer) resumes the handler",
	"resolve-step-not": "resolved: the step is not done; the next retry (or a recoverer) resumes the handler and runs it",
}

func doneMessage(code string) string { return doneMessages[code] }

// auditPage lists the latest audit entries: GET /audit.
func (c *console) auditPage(w http.ResponseWriter, r *http.Request) {
	data := map[string]any{"Title": "Audit log"}
	if c.reader == nil {
		data["Error"] = "the audit sink (idemui.WithAudit) cannot be read back; see the service's logs (message \"idemui: operator action\")"
	} else if entries, err := c.reader.Entries(r.Context(), "", 200); err != nil {
		data["Error"] = err.Error()
	} else {
		data["Entries"] = entries
	}
	c.render(w, r, "audit", http.StatusOK, data)
}
