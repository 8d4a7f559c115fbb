package idem

import (
	"net/http"
	"strconv"
)

// Response is an HTTP response the [Engine] answers with (a replay or a
// problem), or one [DecodeResponse] decoded. Header holds the header
// lines; Body is the exact byte sequence the handler wrote.
//
// A replay is read in place from the store's bytes ([Record.Response]):
// its Header is nil and its lines are read with [Response.EachHeader] and
// written with [Response.Send] or [Response.WriteLines]. Such a Response
// and its Body are read-only.
type Response struct {
	Status int
	Header http.Header
	Body   []byte

	wire    *wire   // a replay read in place: its header lines (Header is nil)
	outcome Outcome // the engine's own answer it is (problem.go), else 0
}

// IsReplay reports whether resp is a stored response being replayed (it
// carries "Idempotent-Replayed: true"), as opposed to a problem the engine
// answered with.
func (resp *Response) IsReplay() bool {
	if resp.wire != nil && resp.Header == nil {
		return resp.wire.replayed
	}
	v := resp.Header[ReplayedHeader] // canonical: no Get, which canonicalises
	return len(v) > 0 && v[0] == "true"
}

// Send writes resp to w: header lines (replacing any of the same name), status
// and body. Adapters on net/http based frameworks use it for Begin's answers.
func (resp *Response) Send(w http.ResponseWriter) {
	h := w.Header()
	length := bodyAllowed(resp.Status)
	if resp.wire != nil && resp.Header == nil {
		// Straight into the writer's header, no map in between; the
		// Content-Length value shares the lines' array.
		if values := resp.wire.fill(h, length); length {
			values[0] = strconv.Itoa(len(resp.Body))
			h["Content-Length"] = values[:1:1]
		}
	} else {
		for k, v := range resp.Header {
			h[k] = append([]string(nil), v...)
		}
		if length {
			h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
		}
	}
	w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body)
	}
}

// bodyAllowed reports whether a response with status may carry a body and
// Content-Length (RFC 9110 sections 6.4.1 and 8.6).
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// LineWriter is a framework's own response header type, as
// [Response.WriteLines] writes to it; fasthttp's *ResponseHeader (Fiber
// v2 and v3) is one.
type LineWriter interface {
	Del(name string)
	Add(name, value string)
}

// WriteLines writes resp's header lines to h, replacing the lines h holds
// under the same names, as [Response.Send] does for net/http. Every name is
// deleted before the first line is added: fasthttp's Del moves the
// header's last line into the gap, which would reorder lines already added.
func (resp *Response) WriteLines(h LineWriter) {
	prev := ""
	resp.EachHeader(func(k, _ string) {
		if k != prev {
			h.Del(k)
			prev = k
		}
	})
	resp.EachHeader(h.Add)
}

// EachHeader calls fn for every header line of resp, lines of one name in a
// row: the lines of Header, or, for a replay read in place (Header is
// nil), the stored lines followed by "Idempotent-Replayed: true". Adapters that write Begin's answers to a
// framework's own header type use it; name and value are read-only.
func (resp *Response) EachHeader(fn func(name, value string)) {
	if resp.Header != nil || resp.wire == nil {
		for k, vs := range resp.Header {
			for _, v := range vs {
				fn(k, v)
			}
		}
		return
	}
	d := strDecoder{s: resp.wire.lines}
	for range resp.wire.names {
		k := d.string()
		skip := resp.wire.replayed && k == ReplayedHeader // the marker replaces a stored line (as header's map does)
		for range d.uvarint() {
			if v := d.string(); !skip {
				fn(k, v)
			}
		}
	}
	if resp.wire.replayed {
		fn(ReplayedHeader, "true")
	}
}

// header returns resp's header lines as an http.Header (Header, or for a
// replay read in place, a new map whose strings alias the encoding; its
// value slices share one array, each capped so that an append copies).
func (resp *Response) header() http.Header {
	if resp.Header != nil || resp.wire == nil {
		return resp.Header
	}
	h := make(http.Header, resp.wire.names+1)
	resp.wire.fill(h, false)
	return h
}

// fill sets w's header lines in h, each name replacing any lines of that
// name h had, and the "Idempotent-Replayed: true" line of a replay. The
// value slices share one array, capped so that an append copies; with
// spare, the array has one more value, returned (empty) for the caller's
// own line.
func (w *wire) fill(h http.Header, spare bool) (rest []string) {
	n := int(w.values) + 1 // the stored values, the marker's
	if spare {
		n++
	}
	values := w.takeRoom(n) // taken once: each header gets values of its own
	if values == nil {
		values = make([]string, n)
	}
	d := strDecoder{s: w.lines}
	values = fillHeader(&d, int(w.names), h, values)
	if w.replayed {
		values[0] = "true"
		h[ReplayedHeader] = values[:1:1]
	}
	return values[1:]
}
