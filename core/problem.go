package idem

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// ProblemTypeBase prefixes the "type" member of every problem idem writes; the
// fragment names the case, documented in the README's behaviour table.
const ProblemTypeBase = "https://github.com/idemkit/idem#"

// Problem is an RFC 9457 problem details object, sent as
// application/problem+json.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// OriginalStatus is set on "response-not-stored" problems: the status the
	// handler answered the first request with.
	OriginalStatus int `json:"original_status,omitempty"`
}

// Response returns p as a response with Content-Type application/problem+json.
func (p Problem) Response() *Response {
	body, _ := json.Marshal(p)
	return &Response{
		Status: p.Status,
		Header: http.Header{"Content-Type": {"application/problem+json"}},
		Body:   body,
	}
}

// problems are the engine's fixed answers, built once.
type problems struct {
	missing, malformed, tooLong, conflictingKeys, noPrincipal,
	badBody, tooLarge, mismatch, inProgress, unavailable, unreadable,
	forbidden, fingerprintChanged, uncertain, keyExpired *Response
	recoveryRefused, tooLargeToRecover *Response
	render                             func(Problem) (contentType string, body []byte) // WithProblemRenderer; nil: RFC 9457

	// inProgressAfter holds, at index n, the 409 in-progress answer with
	// "Retry-After: n", built on first use (inProgressFor).
	inProgressAfter *[maxCachedRetryAfter + 1]atomic.Pointer[Response]
}

// maxCachedRetryAfter is the largest Retry-After, in seconds, whose 409 is
// kept once built; larger ones are built per answer.
const maxCachedRetryAfter = 300

// inProgressFor returns the 409 in-progress answer with "Retry-After:
// seconds" (>= 1), without allocating once it was built.
func (ps *problems) inProgressFor(seconds int64) *Response {
	if seconds <= maxCachedRetryAfter {
		if r := ps.inProgressAfter[seconds].Load(); r != nil {
			return r
		}
	}
	base := ps.inProgress
	h := make(http.Header, len(base.Header))
	for k, v := range base.Header {
		h[k] = v // shared, read-only
	}
	h["Retry-After"] = []string{strconv.FormatInt(seconds, 10)}
	r := &Response{Status: base.Status, Header: h, Body: base.Body, outcome: base.outcome}
	if seconds <= maxCachedRetryAfter {
		ps.inProgressAfter[seconds].Store(r)
	}
	return r
}

// response returns p as the engine answers it: RFC 9457, or as rendered.
func (ps *problems) response(p Problem) *Response {
	o := OutcomeOfType(p.Type)
	if ps.render == nil {
		r := p.Response()
		r.outcome = o
		return r
	}
	ct, body := ps.render(p)
	return &Response{Status: p.Status, Header: http.Header{"Content-Type": {ct}}, Body: body, outcome: o}
}

func newProblems(retryAfter time.Duration, render func(Problem) (string, []byte)) problems {
	ps := &problems{render: render}
	p := func(slug, title string, status int, detail string) *Response {
		return ps.response(Problem{Type: ProblemTypeBase + slug, Title: title, Status: status, Detail: detail})
	}
	ra := strconv.FormatInt(ceilSeconds(retryAfter), 10)
	withRetry := func(r *Response) *Response { r.Header.Set("Retry-After", ra); return r }
	ps2 := problems{
		render:          render,
		inProgressAfter: new([maxCachedRetryAfter + 1]atomic.Pointer[Response]),
		missing: p("key-missing", "Idempotency key missing", http.StatusBadRequest,
			"This operation requires an Idempotency-Key header: a unique value, e.g. a UUID, sent again unchanged with every retry."),
		malformed: p("key-malformed", "Idempotency key malformed", http.StatusBadRequest,
			`The Idempotency-Key header must be 1 to 255 visible ASCII characters, bare (abc) or as a structured-field string ("abc").`),
		tooLong: p("key-malformed", "Idempotency key malformed", http.StatusBadRequest,
			"The Idempotency-Key header is longer than 255 characters."),
		conflictingKeys: p("key-malformed", "Idempotency key malformed", http.StatusBadRequest,
			"The Idempotency-Key header was sent more than once with different values."),
		noPrincipal: p("no-principal", "No principal to scope the idempotency key", http.StatusUnauthorized,
			"Idempotency keys are scoped to the authenticated caller; this request has none."),
		badBody: p("body-unreadable", "Request body unreadable", http.StatusBadRequest,
			"The request body could not be read completely."),
		tooLarge: p("body-too-large", "Request body too large", http.StatusRequestEntityTooLarge,
			"The request body is larger than this endpoint accepts for idempotent requests; nothing was executed."),
		mismatch: p("key-reused", "Idempotency key reused", http.StatusUnprocessableEntity,
			"This Idempotency-Key was already used with a different request (path, query, Content-Type or body). Use a new key for a new request."),
		fingerprintChanged: p("fingerprint-changed", "Request fingerprint changed", http.StatusUnprocessableEntity,
			"A request with this Idempotency-Key was recorded while this service compared requests another way (a configuration change), so it cannot tell whether this request is the same one; nothing was executed. Use a new key for a new request."),
		forbidden: p("replay-forbidden", "Replay forbidden", http.StatusForbidden,
			"A request with this Idempotency-Key was already made, and this caller is not allowed to see its outcome."),
		uncertain: p("operation-uncertain", "Operation outcome uncertain", http.StatusConflict,
			"A request with this Idempotency-Key started but its server stopped before recording the outcome, so it may or may not have taken effect. Do not retry automatically: the service operator must resolve it first."),
		recoveryRefused: p("recovery-refused", "Recovery refused", http.StatusForbidden,
			"This request carries an Idem-Recovery header that no pending recovery run of this server issued; nothing was executed. Clients must not send it."),
		tooLargeToRecover: p("body-too-large", "Request body too large", http.StatusRequestEntityTooLarge,
			"The request is larger than this endpoint can keep to finish it without the client (recovery); nothing was executed."),
		keyExpired: p("key-expired", "Idempotency key expired", http.StatusGone,
			"This Idempotency-Key was used, and its response is no longer stored. Do not retry with it: check the outcome of the original request, and use a new key for a new request."),
		inProgress: withRetry(p("in-progress", "Request in progress", http.StatusConflict,
			"A request with this Idempotency-Key is still being processed. Retry after the Retry-After delay to get its result.")),
		unavailable: withRetry(p("store-unavailable", "Idempotency store unavailable", http.StatusServiceUnavailable,
			"The idempotency store could not be reached, so the request was not executed. It is safe to retry with the same key.")),
		unreadable: p("stored-result-unreadable", "Stored result unreadable", http.StatusInternalServerError,
			"A request with this Idempotency-Key was recorded, but its stored result cannot be read, so it is neither replayed nor executed again. Retrying will not help until the service operator clears the record."),
	}
	if n := ceilSeconds(retryAfter); n <= maxCachedRetryAfter {
		ps2.inProgressAfter[n].Store(ps2.inProgress)
	}
	return ps2
}

func (p *problems) forKeyError(err error) *Response {
	switch {
	case errors.Is(err, ErrKeyMissing):
		return p.missing
	case errors.Is(err, ErrKeyTooLong):
		return p.tooLong
	case errors.Is(err, ErrKeyConflict):
		return p.conflictingKeys
	}
	return p.malformed
}

// refusedKey is the answer to a key the [WithKeyValidator] function refused.
func (p *problems) refusedKey(err error) *Response {
	return p.response(Problem{Type: ProblemTypeBase + "key-malformed", Title: "Idempotency key malformed", Status: http.StatusBadRequest,
		Detail: "The Idempotency-Key header does not have the form this service requires: " + err.Error()})
}

// notStored is the encoding of what replays of a response above the
// stored-response limit answer.
func (p *problems) notStored(status int, location string) []byte {
	r := p.response(Problem{
		Type: ProblemTypeBase + "response-not-stored", Title: "Response not stored", Status: http.StatusGone,
		Detail:         "The request with this Idempotency-Key was executed once, but its response was too large to store and cannot be replayed.",
		OriginalStatus: status,
	})
	if location != "" {
		r.Header.Set("Location", location)
	}
	return encodeAll(r)
}
