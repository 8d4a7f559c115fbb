package idemwebhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
)

// Option configures the receiver.
type Option func(*config)

type config struct{ maxBody int64 }

// DefaultMaxBodyBytes is the default body limit, the engine's default
// (idem.WithMaxBodyBytes): 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

// WithMaxBodyBytes sets the largest body read and verified, in bytes;
// a larger one is answered 413 before verification. Optional. Default is
// [DefaultMaxBodyBytes]; n must be > 0, and at most the engine's limit
// (idem.WithMaxBodyBytes), which otherwise answers 413 after verification.
func WithMaxBodyBytes(n int64) Option { return func(c *config) { c.maxBody = n } }

// New returns middleware that receives the deliveries of one sender: it
// reads the body once (at most the body limit), verifies it with scheme
// before any store call, then runs next at most once per event id through
// e, scoped by sender and the route, and answers as senders expect (see
// the package doc): the stored response to a redelivery of a processed
// event, 503 with Retry-After while the event is being processed, 400 for
// a delivery that does not verify.
//
// sender names the sender and endpoint ("stripe", "stripe-connect",
// "svix-billing"): it is the principal of the event ids' scope, so the same
// id from two senders names two events. The route, also in the scope, is
// r.Pattern without its method (http.ServeMux), else the request path. The
// fingerprint is the body: the same event id with another body answers
// 422 and runs nothing.
//
// New panics when e, scheme or sender is missing or an option is out of
// range.
func New(e *idem.Engine, sender string, scheme Scheme, opts ...Option) func(http.Handler) http.Handler {
	c := config{maxBody: DefaultMaxBodyBytes}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case e == nil || scheme == nil || sender == "":
		panic("idemwebhook: New needs an engine, a sender name and a scheme")
	case c.maxBody <= 0:
		panic("idemwebhook: WithMaxBodyBytes needs n > 0")
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				w.Header().Set("Allow", http.MethodPost)
				problem("webhook-malformed", "Method not allowed", http.StatusMethodNotAllowed,
					"Webhook deliveries are POST requests.").Send(w)
				return
			}
			body, err := io.ReadAll(io.LimitReader(r.Body, c.maxBody+1))
			switch {
			case err != nil:
				problem("body-unreadable", "Request body unreadable", http.StatusBadRequest,
					"The delivery's body could not be read completely; nothing was processed.").Send(w)
				return
			case int64(len(body)) > c.maxBody:
				problem("body-too-large", "Request body too large", http.StatusRequestEntityTooLarge,
					"The delivery's body is larger than this endpoint accepts; nothing was processed.").Send(w)
				return
			}
			d, err := scheme.Verify(r.Header, body, time.Now())
			if err == nil && !validID(d.ID) {
				err = errBadID
			}
			if err != nil {
				refused(err).Send(w)
				return
			}
			d.Sender = sender
			req := idem.Request{
				Method:    http.MethodPost,
				Route:     route(r.Pattern),
				Path:      r.URL.Path,
				Keys:      []string{quote(d.ID)},
				Principal: sender,
				Body:      body,
			}
			x, resp := e.Begin(r.Context(), &req)
			if resp != nil {
				answer(w, resp)
				return
			}
			r = r.WithContext(context.WithValue(r.Context(), deliveryKey{}, &d))
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
			if x == nil { // fail-open (idem.WithFailOpen), or inside an execution of e already
				next.ServeHTTP(w, r)
				return
			}
			x.OuterHeader(w.Header())
			cw, xr := x.Capture(w, r)
			defer func() {
				if p := recover(); p != nil {
					x.Abort(cw.Status(), w.Header())
					panic(p)
				}
			}()
			next.ServeHTTP(cw, xr)
			x.Finish(cw.Status(), w.Header())
		})
	}
}

type deliveryKey struct{}

// DeliveryFromContext returns the verified delivery the handler is
// processing (sender, event id, signed timestamp); ok is false outside a
// receiver built by [New].
func DeliveryFromContext(ctx context.Context) (d Delivery, ok bool) {
	p, ok := ctx.Value(deliveryKey{}).(*Delivery)
	if !ok {
		return Delivery{}, false
	}
	return *p, true
}

// route returns a ServeMux pattern without its method: "POST /hooks/x" →
// "/hooks/x"; "" stays "" (the engine then scopes by the path).
func route(pattern string) string {
	if _, path, ok := strings.Cut(pattern, " "); ok {
		return path
	}
	return pattern
}

var errBadID = errors.New("idemwebhook: the event id must be 1 to 255 visible ASCII characters")

// validID reports whether id can be an idempotency key: 1 to
// idem.MaxKeyLength visible ASCII characters.
func validID(id string) bool {
	if id == "" || len(id) > idem.MaxKeyLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// quote returns id as an RFC 8941 sf-string, which idem.ParseKey reads
// back as id exactly (a bare id with a comma or a quote would not be).
func quote(id string) string {
	if !strings.ContainsAny(id, `"\`) {
		return `"` + id + `"`
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(id) + `"`
}

// problem returns an RFC 9457 problem whose type is the README anchor slug.
func problem(slug, title string, status int, detail string) *idem.Response {
	return idem.Problem{Type: idem.ProblemTypeBase + slug, Title: title, Status: status, Detail: detail}.Response()
}

// refused is the answer to a delivery that did not verify.
func refused(err error) *idem.Response {
	msg := strings.TrimPrefix(err.Error(), "idemwebhook: ")
	switch {
	case errors.Is(err, ErrSignature):
		return problem("webhook-signature-invalid", "Signature invalid", http.StatusBadRequest,
			"The delivery's signature does not match this endpoint's secret ("+msg+"); nothing was processed.")
	case errors.Is(err, ErrTimestamp):
		return problem("webhook-timestamp-outside-tolerance", "Timestamp outside tolerance", http.StatusBadRequest,
			"The delivery's signed timestamp is too far from this server's clock ("+msg+"); nothing was processed. Senders sign every retry anew.")
	case errors.Is(err, ErrMalformed), errors.Is(err, errBadID):
		return problem("webhook-malformed", "Delivery malformed", http.StatusBadRequest, msg+"; nothing was processed.")
	}
	return problem("webhook-verification-failed", "Verification failed", http.StatusServiceUnavailable,
		"The delivery could not be verified now ("+msg+"); nothing was processed. Retry later.")
}

// answer writes the engine's answer resp (a replay or a problem) as a
// sender understands it. Senders retry any non-2xx answer and some disable
// an endpoint on 409 or 410 (Standard Webhooks: 410 Gone means "stop
// sending"), so: idem's 410s (the event was processed: "key-expired", a
// tombstone, or "response-not-stored", an answer too large to store) become
// the original status (200 for a tombstone) with Idempotent-Replayed and
// no body; other replays (a handler's own 410 included) are sent as stored;
// 409 (the event in progress, or uncertain after a crash) becomes 503, with
// the engine's Retry-After when it gave one. Every other answer (400, 403,
// 413, 422, 500, 503) is sent as it is.
func answer(w http.ResponseWriter, resp *idem.Response) {
	switch {
	case resp.Status == http.StatusGone:
		var p idem.Problem
		_ = json.Unmarshal(resp.Body, &p) // a handler's own 410, or a custom renderer's body: sent as it is
		switch p.Type {
		case idem.ProblemTypeBase + "key-expired":
			p.OriginalStatus = http.StatusOK
		case idem.ProblemTypeBase + "response-not-stored":
		default:
			p.OriginalStatus = 0
		}
		if p.OriginalStatus == 0 {
			resp.Send(w)
			return
		}
		w.Header().Set(idem.ReplayedHeader, "true")
		w.WriteHeader(p.OriginalStatus)
	case resp.IsReplay():
		resp.Send(w)
	case resp.Status == http.StatusConflict:
		retryAfter := ""
		resp.EachHeader(func(name, value string) {
			if name == "Retry-After" {
				retryAfter = value
			}
		})
		p := problem("webhook-in-progress", "Event in progress", http.StatusServiceUnavailable,
			"This event is being processed by another delivery. Retry after the Retry-After delay to get its result.")
		if retryAfter == "" {
			p = problem("operation-uncertain", "Event outcome uncertain", http.StatusServiceUnavailable,
				"A delivery of this event started processing but its server stopped before recording the outcome. The service operator must resolve it; until then every delivery of it is refused.")
		} else {
			p.Header.Set("Retry-After", retryAfter)
		}
		p.Send(w)
	default:
		resp.Send(w)
	}
}
