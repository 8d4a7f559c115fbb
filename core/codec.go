package idem

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"unsafe"
)

// errCorrupt is returned by UnmarshalBinary for bytes MarshalBinary did not produce.
var errCorrupt = errors.New("idem: corrupt stored response")

const codecVersion = 1

// MarshalBinary encodes r compactly for stores that keep bytes (binary-safe:
// bodies and header values may hold any byte). Layout: version byte,
// uvarint status, uvarint number of header names, then per name (sorted)
// uvarint-length-prefixed name, uvarint value count and length-prefixed
// values, then the body bytes to the end. It implements encoding.BinaryMarshaler.
func (r *Response) MarshalBinary() ([]byte, error) {
	return r.AppendBinary(nil)
}

// AppendBinary appends the encoding of [Response.MarshalBinary] to b.
func (r *Response) AppendBinary(b []byte) ([]byte, error) {
	if w := r.wire; w != nil && r.Header == nil { // already encoded: copy
		n := w.names
		if w.replayed {
			n++
		}
		b = slices.Grow(b, 1+2*binary.MaxVarintLen64+len(w.lines)+len(replayedLine)+len(r.Body))
		b = append(b, codecVersion)
		b = binary.AppendUvarint(b, uint64(r.Status))
		b = binary.AppendUvarint(b, uint64(n))
		b = append(b, w.lines...)
		if w.replayed {
			b = append(b, replayedLine...)
		}
		return append(b, r.Body...), nil
	}
	header := r.header()
	var stack [16]string
	names := stack[:0]
	size := 1 + 2*binary.MaxVarintLen64 + len(r.Body)
	for k, vs := range header {
		names = append(names, k)
		size += binary.MaxVarintLen64*(2+len(vs)) + len(k)
		for _, v := range vs {
			size += len(v)
		}
	}
	slices.Sort(names)
	b = slices.Grow(b, size)
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = binary.AppendUvarint(b, uint64(len(header)))
	for _, k := range names {
		b = appendString(b, k)
		vs := header[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return append(b, r.Body...), nil
}

// replayedLine is "Idempotent-Replayed: true" as one encoded header name.
var replayedLine = string(appendString(binary.AppendUvarint(appendString(nil, ReplayedHeader), 1), "true"))

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// UnmarshalBinary decodes what [Response.MarshalBinary] produced into r,
// copying out of data: all header names and values share one string
// allocation, the body gets its own. It implements encoding.BinaryUnmarshaler.
func (r *Response) UnmarshalBinary(data []byte) error {
	l, ok := scanEncoding(data)
	if !ok {
		return errCorrupt
	}
	// One copy of data holds the body (the caller's to modify) and, before
	// it, the header names and values as one string that no slice reaches
	// (body is cut with its capacity starting at headerEnd).
	all := make([]byte, len(data))
	copy(all, data)
	body := all[l.headerEnd:len(data):len(data)]
	sd := strDecoder{s: unsafe.String(unsafe.SliceData(all), l.headerEnd)[l.linesStart:]}
	h := make(http.Header, l.names+1) // room for the replay's Idempotent-Replayed line
	fillHeader(&sd, l.names, h, make([]string, l.values))
	r.Status, r.Header, r.Body = l.status, h, body
	return nil
}

// layout is where the parts of a valid encoding lie.
type layout struct {
	status, names, values int // names and values: header lines' counts
	linesStart, headerEnd int // the header names and values are data[linesStart:headerEnd]; the body follows
}

// scanEncoding validates data as an encoding of [Response.MarshalBinary]
// without allocating.
func scanEncoding(data []byte) (layout, bool) {
	d := decoder{b: data}
	if d.byte() != codecVersion {
		return layout{}, false
	}
	status := d.uvarint()
	n := d.uvarint()
	if d.err || status > 999 || n > uint64(len(d.b)) {
		return layout{}, false
	}
	l := layout{status: int(status), names: int(n), linesStart: len(data) - len(d.b)}
	for range n {
		d.skip()
		nv := d.uvarint()
		if d.err || nv > uint64(len(d.b)) {
			return layout{}, false
		}
		for range nv {
			d.skip()
		}
		l.values += int(nv)
	}
	if d.err {
		return layout{}, false
	}
	l.headerEnd = len(data) - len(d.b)
	return l, true
}

// sharedReplay returns the replay of the response encoded in data, reading
// it in place: Body and the header lines ([Response.EachHeader]) alias
// data, which the store never modifies afterwards. Header is nil.
func sharedReplay(data []byte) (*Response, error) {
	l, ok := scanEncoding(data)
	if !ok {
		return nil, errCorrupt
	}
	r := &struct { // one allocation for both
		resp Response
		wire wire
	}{
		resp: Response{Status: l.status, Body: data[l.headerEnd:len(data):len(data)]},
		wire: wire{lines: unsafe.String(unsafe.SliceData(data[l.linesStart:]), l.headerEnd-l.linesStart), names: int32(l.names), replayed: true},
	}
	r.resp.wire = &r.wire
	return &r.resp, nil
}

// wire is the header of a Response held in its encoded form (a replay read
// in place by sharedReplay, or lines captured by encodeLines): the encoded
// header names and values and their counts.
type wire struct {
	lines    string
	names    int32
	replayed bool // the line "Idempotent-Replayed: true" follows them
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
// row: the lines of Header, or, when resp is held encoded (Header is nil:
// a replay the engine read in place from its stored encoding, or a
// response given to [Execution.FinishLines]), the encoded lines, followed
// on a replay by "Idempotent-Replayed: true". Adapters that write Begin's answers to a
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
	n := 1 // values, counted first: one array for all
	for d, i := (strDecoder{s: resp.wire.lines}), int32(0); i < resp.wire.names; i++ {
		d.string()
		nv := d.uvarint()
		n += int(nv)
		for range nv {
			d.string()
		}
	}
	h := make(http.Header, resp.wire.names+1)
	values := make([]string, n)
	d := strDecoder{s: resp.wire.lines}
	values = fillHeader(&d, int(resp.wire.names), h, values)
	if resp.wire.replayed {
		values[0] = "true"
		h[ReplayedHeader] = values[:1:1]
	}
	return h
}

// fillHeader reads names header names, each with its values, from d into
// h; the value slices are cut from values, capped so that an append
// copies. It returns what is left of values.
func fillHeader(d *strDecoder, names int, h http.Header, values []string) []string {
	for range names {
		k := d.string()
		nv := int(d.uvarint())
		vs := values[:nv:nv]
		values = values[nv:]
		for j := range vs {
			vs[j] = d.string()
		}
		h[k] = vs
	}
	return values
}

type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.err = true
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) skip() {
	n := d.uvarint()
	if d.err || n > uint64(len(d.b)) {
		d.err = true
		return
	}
	d.b = d.b[n:]
}

// strDecoder reads what decoder validated, as substrings.
type strDecoder struct{ s string }

func (d *strDecoder) uvarint() uint64 {
	var v uint64
	for shift := 0; ; shift += 7 {
		c := d.s[0]
		d.s = d.s[1:]
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v
		}
	}
}

func (d *strDecoder) string() string {
	n := d.uvarint()
	s := d.s[:n]
	d.s = d.s[n:]
	return s
}

// HeaderLines collects the response header lines of a framework with its
// own header type, for [Execution.FinishLines], without allocating while
// they fit 1 KiB and 32 lines (past that it keeps them in an http.Header):
// declare one on the stack and Add every line. The zero value is ready.
type HeaderLines struct {
	buf   [1024]byte
	spans [32]lineSpan
	used  int // bytes of buf
	count int // spans
	more  http.Header
}

type lineSpan struct{ at, name, value uint16 } // offset in buf, lengths

// noLines is the HeaderLines of a FinishLines given none (read only).
var noLines HeaderLines

// Add appends the line name: value (both copied). The name is stored in
// its canonical form, as the key of an http.Header
// ([http.CanonicalHeaderKey]): frameworks that keep names as the handler
// set them (Fiber's DisableHeaderNormalizing) would otherwise escape the
// unstored names and the outer lines ([Execution.OuterHeader]), which are
// canonical.
func (l *HeaderLines) Add(name, value []byte) {
	if l.more == nil && l.count < len(l.spans) && l.used+len(name)+len(value) <= len(l.buf) {
		l.spans[l.count] = lineSpan{uint16(l.used), uint16(len(name)), uint16(len(value))}
		n := copy(l.buf[l.used:], name)
		canonicalKey(l.buf[l.used : l.used+n])
		l.used += n
		l.used += copy(l.buf[l.used:], value)
		l.count++
		return
	}
	if l.more == nil {
		l.more = make(http.Header, l.count+1)
		for i := range l.count {
			k, v := l.line(i)
			l.more[string(k)] = append(l.more[string(k)], string(v))
		}
	}
	k := http.CanonicalHeaderKey(string(name))
	l.more[k] = append(l.more[k], string(value))
}

// canonicalKey rewrites k in place as [http.CanonicalHeaderKey] would
// return it: unchanged unless it is a token, else upper case first and
// after each hyphen, lower case elsewhere.
func canonicalKey(k []byte) {
	if !isToken(unsafe.String(unsafe.SliceData(k), len(k))) {
		return
	}
	upper := true
	for i, c := range k {
		switch {
		case upper && 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		case !upper && 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		k[i] = c
		upper = c == '-'
	}
}

func (l *HeaderLines) line(i int) (name, value []byte) {
	sp := l.spans[i]
	name = l.buf[sp.at : sp.at+sp.name]
	return name, l.buf[sp.at+sp.name : sp.at+sp.name+sp.value]
}

// location returns the first Location line's value, or "".
func (l *HeaderLines) location() string {
	for i := range l.count {
		if k, v := l.line(i); string(k) == "Location" {
			return string(v)
		}
	}
	return ""
}

// encodeLines returns the Response holding the lines worth replaying (see
// storedHeader) and body in their stored encoding, in one new buffer; w
// receives its header.
func (e *Engine) encodeLines(l *HeaderLines, status int, body []byte, outer http.Header, w *wire) Response {
	var keep [32]bool // the first line of each stored name
	size, names := 1+2*binary.MaxVarintLen64+len(body), 0
	for i := range l.count {
		k, _ := l.line(i)
		if l.seen(i, k) || !e.storesLines(l, i, k, outer) {
			continue
		}
		keep[i] = true
		names++
		size += 2*binary.MaxVarintLen64 + len(k)
		for j := i; j < l.count; j++ {
			if nk, v := l.line(j); string(nk) == string(k) {
				size += binary.MaxVarintLen64 + len(v)
			}
		}
	}
	b := make([]byte, 0, size)
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(status))
	b = binary.AppendUvarint(b, uint64(names))
	start := len(b)
	for i := range l.count {
		if !keep[i] {
			continue
		}
		k, _ := l.line(i)
		n := 0
		for j := i; j < l.count; j++ {
			if nk, _ := l.line(j); string(nk) == string(k) {
				n++
			}
		}
		b = append(binary.AppendUvarint(b, uint64(len(k))), k...)
		b = binary.AppendUvarint(b, uint64(n))
		for j := i; j < l.count; j++ {
			if nk, v := l.line(j); string(nk) == string(k) {
				b = append(binary.AppendUvarint(b, uint64(len(v))), v...)
			}
		}
	}
	end := len(b)
	b = append(b, body...)
	*w = wire{lines: unsafe.String(unsafe.SliceData(b[start:]), end-start), names: int32(names)}
	return Response{Status: status, Body: b[end:len(b):len(b)], wire: w}
}

// seen reports whether a line before i is named k.
func (l *HeaderLines) seen(i int, k []byte) bool {
	for j := range i {
		if pk, _ := l.line(j); string(pk) == string(k) {
			return true
		}
	}
	return false
}

// storesLines is [Engine.stores] for the lines named k, the first at i.
func (e *Engine) storesLines(l *HeaderLines, i int, k []byte, outer http.Header) bool {
	if !e.storesName(unsafe.String(unsafe.SliceData(k), len(k))) { // k is only read
		return false
	}
	ov := outer[string(k)]
	if ov == nil {
		return true
	}
	n := 0
	for j := i; j < l.count; j++ {
		if nk, v := l.line(j); string(nk) == string(k) {
			if n >= len(ov) || ov[n] != string(v) {
				return true // the handler changed it
			}
			n++
		}
	}
	return n != len(ov)
}
