package idemui

import (
	"crypto/hmac"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
)

// actionNames are the actions an operator can take on a record.
var actionNames = []string{"evict", "release", "complete", "resolve-step"}

// writer returns the operator of a write request, or answers it (403 when
// writes are off, 401 without an operator) and returns "".
func (c *console) writer(w http.ResponseWriter, r *http.Request, key string) string {
	if !c.cfg.writes {
		c.fail(w, r, http.StatusForbidden, key, "this console is read-only: the service enables actions with idemui.WithWrites")
		return ""
	}
	op, ok := c.operator(r)
	if !ok || op == "" {
		c.fail(w, r, http.StatusUnauthorized, key, "actions need an authenticated operator")
		return ""
	}
	return op
}

// confirm is an action's confirmation page: GET
// /record/{key}/confirm?action=&step=&done=.
func (c *console) confirm(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	qs := r.URL.Query()
	action, step, done := qs.Get("action"), qs.Get("step"), qs.Get("done") == "1"
	if !validKey(key) || !validAction(action) || (action == "resolve-step") != (step != "") {
		c.fail(w, r, http.StatusBadRequest, "", "want a scoped key, an action (evict, release, complete, resolve-step) and, for resolve-step, its step")
		return
	}
	op := c.writer(w, r, key)
	if op == "" {
		return
	}
	info, found, err := c.lookup(r.Context(), key)
	switch {
	case err != nil:
		c.fail(w, r, http.StatusBadGateway, key, "the store's inspection failed: "+err.Error())
		return
	case !found:
		c.fail(w, r, http.StatusNotFound, key, "no live record: absent, expired or evicted; nothing to do")
		return
	}
	data := map[string]any{"Title": "Confirm " + action, "Key": key, "Action": action, "Step": step, "StepDone": done,
		"Row": c.describe(key, info), "FormToken": c.formToken(op, key),
		"SeenState": info.State.String(), "SeenToken": info.Token, "SeenFingerprint": info.Fingerprint,
		"Retention": c.cfg.retention.String()}
	switch action {
	case "evict":
		data["Question"], data["Steps"] = EvictQuestion(info.State), EvictSteps
	case "release":
		data["Question"], data["Steps"] = ReleaseQuestion, ReleaseSteps
	case "complete":
		data["Question"], data["Steps"] = CompleteQuestion, CompleteSteps
	case "resolve-step":
		data["Question"], data["Steps"] = ResolveStepQuestion(step, done, "the result below"), ResolveStepSteps
	}
	c.render(w, r, "confirm", http.StatusOK, data)
}

func validAction(a string) bool {
	for _, n := range actionNames {
		if a == n {
			return true
		}
	}
	return false
}

// act performs a confirmed action: POST /record/{key}/act. It checks the
// form token, reads the record before and after, and records the audit
// entry; on success it redirects to the record's page.
func (c *console) act(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if !validKey(key) {
		c.fail(w, r, http.StatusBadRequest, "", "a scoped key is 64 lowercase hex characters")
		return
	}
	op := c.writer(w, r, key)
	if op == "" {
		return
	}
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, key, "the form does not parse: "+err.Error())
		return
	}
	if !hmac.Equal([]byte(r.PostForm.Get("form_token")), []byte(c.formToken(op, key))) {
		c.fail(w, r, http.StatusForbidden, key, "the form's token is not this operator's for this record: open the confirmation page again")
		return
	}
	ctx := r.Context()
	f := r.PostForm
	action, step, done := f.Get("action"), f.Get("step"), f.Get("done") == "1"
	if !validAction(action) {
		c.fail(w, r, http.StatusBadRequest, key, "unknown action")
		return
	}
	before, foundBefore, err := c.lookup(ctx, key)
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, key, "the store's inspection failed: "+err.Error())
		return
	}
	e := AuditEntry{Operator: op, Action: action, Key: key, Before: c.summary(before, foundBefore)}
	var actErr error
	var code string
	switch action {
	case "evict":
		code = "evict"
		seen := idem.Record{State: stateOf(f.Get("seen_state")), Token: f.Get("seen_token"), Fingerprint: f.Get("seen_fingerprint")}
		switch err := c.in.Evict(ctx, key, seen); {
		case errors.Is(err, idem.ErrRecordChanged):
			actErr = errors.New("not evicted: the record changed since it was shown (it completed, changed owner or expired); look at it again")
		default:
			actErr = err
		}
	case "release", "complete":
		code = action
		actErr = c.resolve(r, action, key, before, foundBefore, &e)
	case "resolve-step":
		code = "resolve-step"
		var result []byte
		if done {
			result = []byte(strings.TrimSpace(f.Get("result")))
			e.Detail = fmt.Sprintf("step %s done with %d bytes of result", step, len(result))
		} else {
			code = "resolve-step-not"
			e.Detail = fmt.Sprintf("step %s not done", step)
		}
		switch err := idem.ResolveStep(ctx, c.store, key, step, result, done); {
		case errors.Is(err, idem.ErrRecordChanged):
			actErr = fmt.Errorf("not resolved: the record is not uncertain or in progress with a lapsed lease with step %s started and not done (completed, its lease held, expired, no such step, or the step done); look at it again", step)
		default:
			actErr = err
		}
	}
	after, foundAfter, err := c.lookup(ctx, key)
	if err != nil {
		e.After = "unknown: " + err.Error()
	} else {
		e.After = c.summary(after, foundAfter)
	}
	if actErr != nil {
		e.Err = actErr.Error()
	}
	e.Time = time.Now().UTC()
	c.recordAudit(ctx, e)
	if actErr != nil {
		c.fail(w, r, http.StatusConflict, key, actErr.Error())
		return
	}
	redirect(w, r, "/record/"+key+"?done="+url.QueryEscape(code))
}

// resolve runs release and complete ([idem.Keeper.Resolve]) on the
// uncertain record before.
func (c *console) resolve(r *http.Request, action, key string, before idem.RecordInfo, found bool, e *AuditEntry) error {
	if c.kp == nil {
		return errors.New("this store keeps no uncertain records (it does not implement idem.Keeper)")
	}
	if !found || before.State != idem.StateUncertain {
		return fmt.Errorf("not resolved: the record is %s, not uncertain (evict deletes any record)", c.summary(before, found))
	}
	var answer []byte
	retention := c.cfg.retention
	if action == "complete" {
		f := r.PostForm
		status, err := strconv.Atoi(strings.TrimSpace(f.Get("status")))
		if err != nil || status < 100 || status > 599 {
			return errors.New("complete needs a status, 100 to 599")
		}
		if s := strings.TrimSpace(f.Get("retention")); s != "" {
			if retention, err = time.ParseDuration(s); err != nil || retention <= 0 {
				return errors.New("the retention must be a duration > 0, e.g. 24h")
			}
		}
		resp := &idem.Response{Status: status, Header: http.Header{}}
		for line := range strings.Lines(f.Get("headers")) {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			name, value, ok := strings.Cut(line, ":")
			if !ok || strings.TrimSpace(name) == "" || strings.ContainsAny(strings.TrimSpace(name), " \t") {
				return fmt.Errorf("header line %q: want \"Name: value\"", line)
			}
			resp.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		}
		resp.Body = []byte(f.Get("body"))
		answer = idem.EncodeResponse(resp)
		e.Detail = fmt.Sprintf("status %d, %d bytes of body, for %v", status, len(resp.Body), retention)
	}
	if err := c.kp.Resolve(r.Context(), key, answer, retention); errors.Is(err, idem.ErrRecordChanged) {
		return errors.New("not resolved: the record changed since it was shown (its holder completed or released it, or it expired); look at it again")
	} else if err != nil {
		return err
	}
	return nil
}

func stateOf(s string) idem.State {
	for _, st := range []idem.State{idem.StateInProgress, idem.StateCompleted, idem.StateUncertain, idem.StateExpired} {
		if st.String() == s {
			return st
		}
	}
	return 0
}
